"""A benchmark's result table, for the terminal (rich) or as Markdown for docs/, and the
formats of its cells."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

__all__ = ["fmt", "markdown_table", "pct", "print_table", "signed_pct"]


def fmt(value: float | None, digits: int = 2, *, inf: str = "inf") -> str:
    """A number with `digits` decimals; "-" for None or nan, `inf` for an infinite value (a
    capacity benchmark says "overload")."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return inf
    return f"{value:.{digits}f}"


def pct(value: float | None, digits: int = 1) -> str:
    """A share as a percentage: 0.123 -> "12.3 %"; "-" for None or nan."""
    if value is None or math.isnan(value):
        return "-"
    return f"{100 * value:.{digits}f} %"


def signed_pct(value: float | None, digits: int = 1) -> str:
    """A change as a signed percentage: -0.05 -> "-5.0 %"; "-" for None or nan."""
    if value is None or math.isnan(value):
        return "-"
    return f"{100 * value:+.{digits}f} %"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table: the first column left-aligned, the others (figures) right-aligned."""
    lines = [f"| {' | '.join(headers)} |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    lines += [f"| {' | '.join(str(cell) for cell in row)} |" for row in rows]
    return "\n".join(lines)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                markdown: bool = False, *, width: int | None = None) -> None:
    """Print a table: Markdown (title in bold above it) or a rich table of `width` columns."""
    if markdown:
        print(f"\n**{title}**\n" if title else "")
        print(markdown_table(headers, rows))
        return
    table = Table(title=title or None)
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    Console(width=width).print(table)
