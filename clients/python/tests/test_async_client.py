"""The async client against the live servers (and the mock for retry timing)."""

from __future__ import annotations

import asyncio
import time

import pytest
import json
from urllib.parse import parse_qs, urlsplit

from conftest import ERASE_KEY, ERASE_TENANT, INFO_OK, LIMITED_KEY, MEMORY_ID, README_TURNS, TURN_V1, TURN_V2, Reply, error

from recollect_client import (
    AsyncClient,
    AuthenticationError,
    BadRequestError,
    MemoryHistory,
    NotFoundError,
    RateLimitError,
    RecollectTimeoutError,
    RetryPolicy,
    ServiceUnavailableError,
    Turn,
    aiter_items,
    Page,
)

pytestmark = pytest.mark.anyio


async def test_store_recall_get_and_delete(aclient, conv):
    ids = (await aclient.store_turns(conv, README_TURNS, wait=True)).memory_ids
    hits = await aclient.recall("What did Melanie paint?", conversation_ids=[conv], k=5)
    assert hits.memories[0].memory_id == ids[1]
    assert "sunrise" in hits.memories[0].user
    turns = await aclient.get_memories(ids)
    assert [t.user_speaker for t in turns] == ["Caroline", "Melanie"]
    info = await aclient.conversation_info(conv)
    assert (info.turns, info.recallable) == (2, 2)
    assert (await aclient.delete_conversation(conv)).turns_erased == 2
    with pytest.raises(NotFoundError):
        await aclient.conversation_info(conv)


async def test_concurrent_stores_and_bounded_get_memories(aclient, conv):
    convs = [f"{conv}-{i}" for i in range(6)]
    try:
        ids = await asyncio.gather(
            *(aclient.store_turn(c, f"note {i} about project Falcon", turn_id="1", wait=True) for i, c in enumerate(convs))
        )
        assert len(set(ids)) == 6
        turns = await aclient.get_memories(ids * 3, concurrency=4)
        assert [t.memory_id for t in turns] == ids * 3
        hits = await aclient.recall("project Falcon", conversation_ids=convs, k=10)
        assert {m.conversation_id for m in hits.memories} == set(convs)
    finally:
        await asyncio.gather(*(aclient.delete_conversation(c) for c in convs))


async def test_listings(aclient, conv):
    ids = (await aclient.store_turns(conv, [{"user": f"entry {i}", "timestamp": "2024-01-01T00:00:00Z"} for i in range(5)],
                                     wait=True)).memory_ids
    page = await aclient.list_turns(conv, limit=2)
    assert [t.position for t in page.turns] == [0, 1] and page.next_cursor
    assert [t.memory_id async for t in aclient.iter_turns(conv, page_size=2)] == ids
    assert conv in [c async for c in aclient.iter_conversations(page_size=3)]
    assert (await aclient.list_conversations(limit=500)).conversations == sorted(
        (await aclient.list_conversations(limit=500)).conversations)
    with pytest.raises(NotFoundError):
        [t async for t in aclient.iter_turns(conv + "-missing")]


async def test_batched_store(aclient, conv):
    turns = [{"user": f"entry {i}", "timestamp": "2024-01-01T00:00:00Z"} for i in range(7)]
    ids = await aclient.store_turns_batched(conv, turns, batch_size=3, wait=True)
    assert len(ids) == 7
    got = await aclient.get_memories(ids)
    assert [t.position for t in got] == list(range(7))


async def test_erase_tenant(url):
    async with AsyncClient(url, ERASE_KEY) as c:
        await c.store_turn("ae-1", "to be erased", wait=True)
        erased = await c.erase_tenant(ERASE_TENANT)
        assert erased.conversations_erased >= 1 and erased.turns_erased >= 1
        with pytest.raises(NotFoundError):
            await c.conversation_info("ae-1")


async def test_operations(aclient):
    assert (await aclient.healthz()).strip() == "ok"
    assert (await aclient.readyz()).strip() == "ready"
    assert await aclient.is_ready()
    await aclient.wait_until_ready(timeout=5)
    assert "recollect_recall_duration_seconds" in await aclient.metrics()
    assert "/v1/recall" in (await aclient.openapi())["paths"]


async def test_errors(url, aclient, conv):
    async with AsyncClient(url, "wrong") as bad:
        with pytest.raises(AuthenticationError) as e:
            await bad.store_turn(conv, "x")
    assert (e.value.status, e.value.code) == (401, "unauthenticated")
    with pytest.raises(BadRequestError) as e:
        await aclient.store_turns(conv, [{"user": "x\u0007y", "timestamp": "2024-01-01T00:00:00Z"}])
    assert e.value.code == "invalid_argument" and "turns[0].user" in e.value.message
    with pytest.raises(BadRequestError):
        await aclient.request("POST", "/v1/recall", json={"query": "x", "k": "ten"})


async def test_429_retry_live(limited_url):
    async with AsyncClient(limited_url, LIMITED_KEY, max_retries=0) as c:
        for _ in range(3):
            try:
                await c.recall("drain")
            except RateLimitError as e:
                assert e.retry_after == 1.0
                break
        else:
            raise AssertionError("no 429 from the limited server")
    async with AsyncClient(limited_url, LIMITED_KEY, max_retries=3) as c:
        start = time.monotonic()
        await c.recall("after the Retry-After delay")
        assert time.monotonic() - start >= 0.9


async def test_retry_after_and_timeout_on_mock(mock):
    mock.script(Reply(503, error("overloaded", "busy"), {"retry-after": "1"}), Reply(200, INFO_OK))
    async with AsyncClient(mock.url, "k") as c:
        start = time.monotonic()
        assert (await c.conversation_info("c")).turns == 1
        assert time.monotonic() - start >= 0.95
    mock.script(Reply(200, INFO_OK, delay=1.0))
    async with AsyncClient(mock.url, "k", timeout=0.2, retry=RetryPolicy(max_retries=0)) as c:
        with pytest.raises(RecollectTimeoutError):
            await c.conversation_info("c")
    mock.script(Reply(503, error("unavailable", "graph store down")))
    async with AsyncClient(mock.url, "k", retry=RetryPolicy(max_retries=1, backoff=0.01)) as c:
        with pytest.raises(ServiceUnavailableError) as e:
            await c.conversation_info("c")
    assert e.value.message == "graph store down"


async def test_edit_history_and_as_of_on_the_wire(mock):
    mock.script(
        Reply(202, TURN_V2),
        Reply(200, {"memory_id": MEMORY_ID, "versions": [TURN_V1, TURN_V2]}),
        Reply(200, {**TURN_V1, "fragments": []}),
        Reply(200, {"memories": []}),
        Reply(404, error("not_found", f"memory {MEMORY_ID} not found")),
    )
    async with AsyncClient(mock.url, "k") as c:
        v2 = await c.edit_memory(MEMORY_ID, user="I like sailing", metadata={"b": 2}, wait=True)
        assert isinstance(v2, Turn) and v2.version == 2 and v2.first_recorded_at is not None
        history = await c.memory_history(MEMORY_ID)
        assert isinstance(history, MemoryHistory) and len(history.versions) == 2
        assert history.versions[0].expired_at == v2.recorded_at
        assert (await c.get_memory(MEMORY_ID, as_of="2026-11-24T08:40:38.2+00:00")).user == "I like kayaking"
        await c.recall("sailing", as_of="2026-11-24T08:40:38.2Z")
        with pytest.raises(NotFoundError):
            await c.edit_memory(MEMORY_ID, assistant="gone")
    path = f"/v1/memories/{MEMORY_ID}"
    assert [(s.method, urlsplit(s.path).path) for s in mock.seen] == [
        ("PATCH", path),
        ("GET", f"{path}/history"),
        ("GET", path),
        ("POST", "/v1/recall"),
        ("PATCH", path),
    ]
    assert json.loads(mock.seen[0].body) == {"user": "I like sailing", "metadata": {"b": 2}, "wait": True}
    assert parse_qs(urlsplit(mock.seen[2].path).query) == {"as_of": ["2026-11-24T08:40:38.2+00:00"]}
    # recall goes through RecallRequest: the same instant, written out in full.
    assert json.loads(mock.seen[3].body)["as_of"] == "2026-11-24T08:40:38.200000Z"
    assert json.loads(mock.seen[4].body) == {"assistant": "gone"}


async def test_cursor_helper_with_an_async_fetcher():
    pages = {None: Page([1, 2], "b"), "b": Page([3], "c"), "c": Page([4, 5])}
    seen = []

    async def fetch(cursor):
        seen.append(cursor)
        await asyncio.sleep(0)
        return pages[cursor]

    assert [x async for x in aiter_items(fetch)] == [1, 2, 3, 4, 5]
    assert seen == [None, "b", "c"]

