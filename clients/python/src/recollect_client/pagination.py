"""Cursor pagination.

The listings of the HTTP API page with opaque cursors: ``GET /v1/conversations`` and
``GET /v1/conversations/{id}/turns`` take ``?limit=&cursor=`` and answer their items and a
``next_cursor`` (absent on the last page). The clients' ``iter_conversations`` and ``iter_turns``
walk them with :func:`iter_items` / :func:`aiter_items`; use these directly for your own fetchers
(a future listing, or a proxy in front of the server)::

    def fetch(cursor: str | None) -> Page[TurnView]:
        page = client.list_turns("chat-1", limit=100, cursor=cursor)
        return Page(page.turns, page.next_cursor)

    for turn in iter_items(fetch):
        ...

A repeated cursor raises instead of looping. :func:`chunked` is the write-side counterpart
(``store_turns_batched`` splits a long conversation into requests under the server's
``max_turns_per_request``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ._base import chunks as chunked

T = TypeVar("T")


@dataclass
class Page(Generic[T]):
    """One page: its items and the cursor of the next page (``None``: this was the last)."""

    items: list[T]
    next_cursor: str | None = None
    extra: dict = field(default_factory=dict)


def _check_cursor(seen: set[str], cursor: str | None) -> None:
    if cursor is not None:
        if cursor in seen:
            raise RuntimeError(f"pagination loop: the server returned cursor {cursor!r} twice")
        seen.add(cursor)


def iter_pages(
    fetch: Callable[[str | None], Page[T]], *, cursor: str | None = None, max_pages: int | None = None
) -> Iterator[Page[T]]:
    """Pages from ``fetch(cursor)``, starting at ``cursor`` (``None``: the first page), until a
    page has no ``next_cursor`` or ``max_pages`` were read. A repeated cursor raises instead of
    looping forever."""
    seen: set[str] = set()
    n = 0
    while max_pages is None or n < max_pages:
        page = fetch(cursor)
        n += 1
        yield page
        if not page.next_cursor:
            return
        _check_cursor(seen, page.next_cursor)
        cursor = page.next_cursor


def iter_items(
    fetch: Callable[[str | None], Page[T]], *, cursor: str | None = None, max_pages: int | None = None
) -> Iterator[T]:
    """The items of :func:`iter_pages`, one by one."""
    for page in iter_pages(fetch, cursor=cursor, max_pages=max_pages):
        yield from page.items


async def aiter_pages(
    fetch: Callable[[str | None], Awaitable[Page[T]]], *, cursor: str | None = None, max_pages: int | None = None
) -> AsyncIterator[Page[T]]:
    """:func:`iter_pages` for an async fetcher."""
    seen: set[str] = set()
    n = 0
    while max_pages is None or n < max_pages:
        page = await fetch(cursor)
        n += 1
        yield page
        if not page.next_cursor:
            return
        _check_cursor(seen, page.next_cursor)
        cursor = page.next_cursor


async def aiter_items(
    fetch: Callable[[str | None], Awaitable[Page[T]]], *, cursor: str | None = None, max_pages: int | None = None
) -> AsyncIterator[T]:
    """The items of :func:`aiter_pages`, one by one."""
    async for page in aiter_pages(fetch, cursor=cursor, max_pages=max_pages):
        for item in page.items:
            yield item


__all__ = ["Page", "iter_pages", "iter_items", "aiter_pages", "aiter_items", "chunked"]
