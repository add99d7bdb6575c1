"""End users, agents and filters, listing by user, erasing one memory, edits with their history
and as_of, reindex, and the 409 on a conflicting turn id, against the live server."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timezone

import pytest

from recollect_client import Client, ConflictError, MemoryErased, MemoryHistory, NotFoundError, Turn
from recollect_client.errors import BadRequestError

from conftest import KEY


def _turns(user: str, n: int, channel: str) -> list[dict]:
    return [
        {
            "turn_id": f"{user}-{i}",
            "user": f"I went kayaking near Lisbon again, trip {i}.",
            "assistant": "Sounds lovely.",
            "timestamp": f"2024-03-{i + 1:02d}T10:00:00Z",
            "user_id": user,
            "agent_id": "coach",
            "metadata": {"channel": channel, "trip": i},
        }
        for i in range(n)
    ]


@pytest.fixture
def two_users(url):
    """Two end users of one tenant, each in a conversation of their own; erased afterwards."""
    tag = uuid.uuid4().hex[:8]
    users = {f"u-{tag}-a": f"py-{tag}-a", f"u-{tag}-b": f"py-{tag}-b"}
    with Client(url, KEY) as c:
        for n, (user, conv) in enumerate(users.items()):
            c.store_turns(conv, _turns(user, 4 + 2 * n, "web" if n == 0 else "app"), wait=True)
        yield users
        for conv in users.values():
            c.delete_conversation(conv)


def test_recall_scoped_to_one_end_user(client, two_users):
    (a, conv_a), (b, _) = list(two_users.items())
    got = client.recall("kayaking Lisbon", user_ids=[a], k=50).memories
    assert len(got) == 4
    assert all(m.user_id == a and m.conversation_id == conv_a for m in got)
    assert all(m.agent_id == "coach" and m.metadata["channel"] == "web" for m in got)
    both = client.recall("kayaking Lisbon", user_ids=[a, b], k=50).memories
    assert len(both) == 10


def test_metadata_time_and_agent_filters(client, two_users):
    users = list(two_users)
    got = client.recall("kayaking", user_ids=users, metadata={"channel": "app", "trip": 2}).memories
    assert [m.turn_id for m in got] == [f"{users[1]}-2"]
    ranged = client.recall(
        "kayaking", user_ids=users, from_="2024-03-02T00:00:00Z", to="2024-03-04T00:00:00Z", k=50
    ).memories
    assert sorted(m.timestamp.day for m in ranged) == [2, 2, 3, 3]
    assert client.recall("kayaking", agent_ids=["nobody"], user_ids=users).memories == []


def test_store_turn_with_end_user_and_datetime_range(client, conv):
    tag = uuid.uuid4().hex[:8]
    user = f"u-{tag}-one"
    for day in (1, 5):
        client.store_turn(
            conv,
            f"Booked the ferry to Porto on day {day}.",
            timestamp=datetime(2024, 5, day, 9, tzinfo=timezone.utc),
            user_speaker="Ana",
            user_id=user,
            agent_id=f"agent-{tag}",
            metadata={"kind": "booking"},
            wait=True,
        )
    got = client.recall(
        "ferry Porto",
        user_ids=[user],
        from_=datetime(2024, 5, 3, tzinfo=timezone.utc),
        to=datetime(2024, 6, 1, tzinfo=timezone.utc),
        k=10,
    ).memories
    assert [(m.timestamp.day, m.user_id, m.agent_id, m.metadata) for m in got] == [
        (5, user, f"agent-{tag}", {"kind": "booking"})
    ]
    assert len(client.recall("ferry", agent_ids=[f"agent-{tag}"], speakers=["Ana"]).memories) == 2
    assert client.recall("ferry", agent_ids=[f"agent-{tag}"], speakers=["Bob"]).memories == []
    assert list(client.iter_conversations(agent_id=f"agent-{tag}")) == [conv]


def test_bad_filter_names_the_field(client):
    with pytest.raises(BadRequestError) as e:
        client.recall("kayaking", metadata={"tags": ["x"]})  # type: ignore[dict-item]
    assert "metadata.tags" in e.value.message
    with pytest.raises(BadRequestError) as e:
        client.list_conversations(user_id="a b")
    assert "user_id" in e.value.message


def test_listing_by_end_user(client, other_client, two_users):
    (a, conv_a), (b, conv_b) = list(two_users.items())
    assert client.list_conversations(user_id=a).conversations == [conv_a]
    assert list(client.iter_conversations(user_id=b, page_size=1)) == [conv_b]
    assert set(client.iter_conversations(agent_id="coach")) >= {conv_a, conv_b}
    assert other_client.list_conversations(user_id=a).conversations == []


def test_delete_one_memory(client, other_client, conv):
    ids = client.store_turns(conv, _turns("u-del", 3, "web"), wait=True).memory_ids
    with pytest.raises(NotFoundError):
        other_client.delete_memory(ids[1])
    erased = client.delete_memory(ids[1])
    assert isinstance(erased, MemoryErased)
    assert (erased.memory_id, erased.conversation_id, erased.turn_id) == (ids[1], conv, "u-del-1")
    with pytest.raises(NotFoundError):
        client.get_memory(ids[1])
    with pytest.raises(NotFoundError):
        client.delete_memory(ids[1])
    assert [t.memory_id for t in client.iter_turns(conv)] == [ids[0], ids[2]]


def test_conflicting_turn_id_is_409_and_stores_nothing(client, conv):
    turns = _turns("u-409", 2, "web")
    client.store_turns(conv, turns, wait=True)
    assert client.store_turns(conv, turns).memory_ids  # a retry: the same ids, nothing new
    changed = dict(turns[1], user="Something else entirely.")
    extra = dict(turns[0], turn_id="u-409-new")
    with pytest.raises(ConflictError) as e:
        client.store_turns(conv, [extra, changed])
    assert e.value.status == 409 and e.value.code == "conflict"
    assert "turns[1].turn_id" in e.value.message and "PATCH /v1/memories/" in e.value.message
    assert [t.turn_id for t in client.iter_turns(conv)] == ["u-409-0", "u-409-1"]


@pytest.mark.anyio
async def test_async_filters_listing_and_delete(aclient, two_users):
    (a, conv_a), _ = list(two_users.items())
    got = (await aclient.recall("kayaking", user_ids=[a], k=50)).memories
    assert {m.user_id for m in got} == {a}
    assert (await aclient.list_conversations(user_id=a)).conversations == [conv_a]
    assert [c async for c in aclient.iter_conversations(user_id=a)] == [conv_a]
    erased = await aclient.delete_memory(got[0].memory_id)
    assert erased.conversation_id == conv_a
    left = (await aclient.recall("kayaking", user_ids=[a], k=50)).memories
    assert len(left) == len(got) - 1


def test_edit_history_and_as_of(client, other_client, conv):
    unstored = datetime.now(timezone.utc)
    time.sleep(0.05)
    ids = client.store_turns(conv, _turns("u-edit", 2, "web"), wait=True).memory_ids
    before = datetime.now(timezone.utc)
    time.sleep(0.05)
    v2 = client.edit_memory(ids[0], user="I went sailing near Porto instead.", metadata={"fixed": True}, wait=True)
    assert isinstance(v2, Turn) and v2.version == 2 and v2.user.startswith("I went sailing")
    assert v2.metadata == {"fixed": True}, "metadata is replaced whole"
    assert v2.assistant == "Sounds lovely." and v2.user_id == "u-edit"
    assert client.edit_memory(ids[0], user="I went sailing near Porto instead.", metadata={"fixed": True}).version == 2
    history = client.memory_history(ids[0])
    assert isinstance(history, MemoryHistory) and len(history.versions) == 2 and history.memory_id == ids[0]
    assert history.versions[0].expired_at is not None and "kayaking" in history.versions[0].user
    assert history.versions[0].version in (None, 1) and history.versions[-1].expired_at is None
    assert history.versions[0].metadata == {"channel": "web", "trip": 0}
    assert v2.first_recorded_at == history.versions[0].recorded_at
    assert history.versions[0].expired_at == v2.recorded_at
    assert "kayaking" in client.get_memory(ids[0], as_of=before).user
    assert client.get_memory(ids[0], as_of=v2.recorded_at).version == 2
    with pytest.raises(NotFoundError):  # nothing held yet at that time
        client.get_memory(ids[0], as_of=unstored)
    assert "sailing" in client.get_memory(ids[0]).user
    top = client.recall("sailing Porto", conversation_ids=[conv], k=1).memories[0]
    assert top.memory_id == ids[0] and "sailing" in top.user
    old = client.recall("sailing Porto", conversation_ids=[conv], k=5, as_of=before).memories
    assert all("sailing" not in m.user for m in old)
    with pytest.raises(BadRequestError) as e:
        client.edit_memory(ids[0])
    assert "at least one of" in e.value.message
    with pytest.raises(BadRequestError) as e:
        client.edit_memory(ids[0], user="  ")
    assert e.value.code == "invalid_argument" and "user" in e.value.message
    with pytest.raises(NotFoundError):
        client.edit_memory(str(uuid.uuid4()), user="no such memory")
    with pytest.raises(NotFoundError):
        other_client.edit_memory(ids[0], user="not yours")
    with pytest.raises(NotFoundError):
        other_client.memory_history(ids[0])
    assert client.reindex().turns >= 2


@pytest.mark.anyio
async def test_async_edit_and_history(aclient, two_users):
    (a, _), _ = list(two_users.items())
    got = (await aclient.recall("kayaking", user_ids=[a], k=1)).memories[0]
    before = datetime.now(timezone.utc)
    await asyncio.sleep(0.05)
    v2 = await aclient.edit_memory(got.memory_id, assistant="", wait=True)
    assert v2.version == 2 and not v2.assistant
    assert len((await aclient.memory_history(got.memory_id)).versions) == 2
    then = await aclient.get_memory(got.memory_id, as_of=v2.recorded_at)
    assert then.version == 2
    assert (await aclient.get_memory(got.memory_id, as_of=before)).assistant == "Sounds lovely."
    now = {m.memory_id: m for m in (await aclient.recall("kayaking", user_ids=[a], k=50)).memories}
    old = {m.memory_id: m for m in (await aclient.recall("kayaking", user_ids=[a], k=50, as_of=before)).memories}
    assert not now[got.memory_id].assistant and old[got.memory_id].assistant == "Sounds lovely."
    with pytest.raises(NotFoundError):
        await aclient.memory_history(str(uuid.uuid4()))
