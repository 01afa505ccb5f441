"""A registry of named implementations (policies, predictors): duplicates and unknowns raise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def decorate(cls: type[T]) -> type[T]:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._entries[name] = cls
            return cls

        return decorate

    def get(self, name: str) -> type[T]:
        """The implementation registered as `name`; unknown names raise, listing the known."""
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries))
            raise ValueError(f"unknown {self.kind} '{name}'; known: {known}") from None

    def create(self, name: str, *args: Any, **kwargs: Any) -> T:
        return self.get(name)(*args, **kwargs)

    def names(self) -> list[str]:
        return sorted(self._entries)
