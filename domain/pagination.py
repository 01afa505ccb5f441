"""OpenAI-style cursor pages (`after`, `limit`, `has_more`) over a table ordered by creation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from domain.errors import InvalidRequest

__all__ = ["Page", "PageQuery", "page_query", "cursor_page", "list_object"]

T = TypeVar("T")
Order = Literal["asc", "desc"]


@dataclass(frozen=True, slots=True)
class PageQuery:
    """What a list endpoint was asked for: start after this id, at most `limit`, in `order`."""

    after: str | None
    limit: int
    order: Order = "desc"


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: Sequence[T]
    has_more: bool


def page_query(args: Mapping[str, str], *, default_limit: int, max_limit: int,
               orders: Sequence[Order] = ("desc",)) -> PageQuery:
    """The query string of a list endpoint, checked (400 naming the parameter)."""
    raw_limit = args.get("limit", str(default_limit))
    try:
        limit = int(raw_limit)
    except ValueError:
        limit = 0
    if not 1 <= limit <= max_limit:
        raise InvalidRequest(f"limit must be an integer from 1 to {max_limit}, got "
                             f"'{raw_limit}'.", param="limit", code="invalid_value")
    order = args.get("order", orders[0])
    if order not in orders:
        raise InvalidRequest(f"order must be one of {', '.join(orders)}.", param="order",
                             code="invalid_value")
    return PageQuery(after=args.get("after") or None, limit=limit, order=order)  # type: ignore[arg-type]


def cursor_page(session: Session, model: type[T], query: PageQuery,
                where: Sequence[ColumnElement[bool]]) -> Page[T]:
    """Rows of `model` matching `where`, by (created_at, id) in the query's order, starting
    after the row whose id is `query.after` (which must match `where` too)."""
    created_at: InstrumentedAttribute[Any] = model.created_at  # type: ignore[attr-defined]
    row_id: InstrumentedAttribute[Any] = model.id  # type: ignore[attr-defined]
    descending = query.order == "desc"
    statement = select(model).where(*where)
    if query.after is not None:
        anchor = session.execute(select(created_at, row_id).where(row_id == query.after, *where)
                                 ).first()
        if anchor is None:
            raise InvalidRequest(f"No object with id '{query.after}' to list after.",
                                 param="after", code="invalid_value")
        beyond = (created_at < anchor[0]) if descending else (created_at > anchor[0])
        beyond_id = (row_id < anchor[1]) if descending else (row_id > anchor[1])
        statement = statement.where(or_(beyond, and_(created_at == anchor[0], beyond_id)))
    ordering = (created_at.desc(), row_id.desc()) if descending else (created_at, row_id)
    rows = session.scalars(statement.order_by(*ordering).limit(query.limit + 1)).all()
    return Page(items=rows[:query.limit], has_more=len(rows) > query.limit)


def list_object(data: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """OpenAI's list envelope."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
