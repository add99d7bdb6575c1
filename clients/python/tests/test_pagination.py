"""The cursor helpers (no endpoint pages yet: they are exercised with fetchers of our own) and
the write-side chunking that store_turns_batched uses."""

from __future__ import annotations

import pytest

from recollect_client import Page, iter_items, iter_pages
from recollect_client.pagination import chunked


def fetcher(pages):
    calls = []

    def fetch(cursor):
        calls.append(cursor)
        return pages[cursor]

    return fetch, calls


def test_iter_items_follows_cursors_to_the_end():
    fetch, calls = fetcher({None: Page(["a", "b"], "p2"), "p2": Page(["c"], "p3"), "p3": Page([], None)})
    assert list(iter_items(fetch)) == ["a", "b", "c"]
    assert calls == [None, "p2", "p3"]


def test_start_cursor_and_max_pages():
    fetch, calls = fetcher({"p2": Page([2], "p3"), "p3": Page([3], "p4"), "p4": Page([4])})
    assert [p.items for p in iter_pages(fetch, cursor="p2", max_pages=2)] == [[2], [3]]
    assert calls == ["p2", "p3"]


def test_a_repeated_cursor_is_an_error_not_a_loop():
    fetch, _ = fetcher({None: Page([1], "x"), "x": Page([2], "x")})
    with pytest.raises(RuntimeError, match="cursor 'x' twice"):
        list(iter_items(fetch))


def test_chunked():
    assert list(chunked(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(chunked([], 3)) == []
    with pytest.raises(ValueError):
        list(chunked([1], 0))
