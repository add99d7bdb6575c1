"""The sync client against a live server: every operation of the HTTP API and its error paths."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pydantic
import pytest
from conftest import ERASE_KEY, ERASE_TENANT, INFO_OK, KEY, README_TURNS, TENANT

from recollect_client import (
    AuthenticationError,
    BadRequestError,
    Client,
    ConversationInfo,
    MemoryHistory,
    NotFoundError,
    RecallResponse,
    RetryPolicy,
    ScoreParts,
    StoreResponse,
    Turn,
    TurnInput,
    TurnPage,
    TurnView,
    UnexpectedResponseError,
)

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
SNAPSHOT = Path(__file__).resolve().parents[2] / "openapi.json"


def test_store_and_recall_the_readme_session(client, conv):
    stored = client.store_turns(conv, README_TURNS, wait=True)
    assert isinstance(stored, StoreResponse)
    assert len(stored.memory_ids) == 2 and all(UUID.match(i) for i in stored.memory_ids)

    hits = client.recall("What did Melanie paint?", conversation_ids=[conv], k=5)
    assert isinstance(hits, RecallResponse)
    top = hits.memories[0]
    assert top.memory_id == stored.memory_ids[1]
    assert top.user == "I painted a sunrise over the lake last week."
    assert top.user_speaker == "Melanie" and top.assistant_speaker == "Caroline"
    assert top.conversation_id == conv
    assert top.timestamp == datetime(2023, 5, 8, 14, 1, tzinfo=timezone.utc)
    assert isinstance(top.score_parts, ScoreParts) and top.score > 0
    assert set(top.sources) <= {"B", "C", "BC", "lexical", "dense", "neighbour", "fallback"} and top.sources
    assert [m.score for m in hits.memories] == sorted((m.score for m in hits.memories), reverse=True)


def test_store_turn_round_trips_through_get_memory(client, conv):
    when = datetime(2024, 2, 29, 23, 30, tzinfo=timezone(timedelta(hours=-5)))
    mid = client.store_turn(
        conv,
        "We adopted a puppy named Biscuit.",
        "What a lovely name!",
        timestamp=when,
        turn_id="t-1",
        user_speaker="Ana",
        assistant_speaker="Bot",
        metadata={"channel": "web", "n": [1, 2]},
        wait=True,
    )
    turn = client.get_memory(mid)
    assert isinstance(turn, TurnView) and isinstance(turn, Turn)
    assert turn.memory_id == mid and turn.tenant == TENANT and turn.conversation_id == conv
    assert turn.turn_id == "t-1" and turn.position == 0
    assert turn.user == "We adopted a puppy named Biscuit." and turn.assistant == "What a lovely name!"
    assert turn.user_speaker == "Ana" and turn.assistant_speaker == "Bot"
    assert turn.timestamp == when
    assert turn.metadata == {"channel": "web", "n": [1, 2]}
    assert turn.recorded_at is not None and turn.recorded_at > when
    # enriched (stored with wait): what the extractor found
    assert turn.extraction is not None and turn.extraction.extractor == "rules"
    assert {"Ana", "Biscuit"} <= set(turn.extraction.entities)
    assert "puppi" in {k.key for k in turn.extraction.keywords}


def test_turn_ids_make_a_repeated_store_idempotent(client, conv):
    turns = [TurnInput(turn_id="a", user="first", timestamp="2024-01-01T00:00:00Z")]
    first = client.store_turns(conv, turns, wait=True)
    again = client.store_turns(conv, turns, wait=True)
    assert first.memory_ids == again.memory_ids
    assert client.conversation_info(conv).turns == 1


def test_conversation_info_and_get_memories(client, conv):
    turns = [{"user": f"turn number {i}", "timestamp": f"2024-01-0{i + 1}T10:00:00Z"} for i in range(3)]
    ids = client.store_turns(conv, turns, wait=True).memory_ids
    info = client.conversation_info(conv)
    assert isinstance(info, ConversationInfo)
    assert (info.conversation_id, info.turns, info.pending, info.recallable) == (conv, 3, 0, 3)
    got = client.get_memories(reversed(ids))
    assert [t.memory_id for t in got] == list(reversed(ids))
    assert [t.position for t in got] == [2, 1, 0]


def test_store_turns_batched_splits_requests(url, conv):
    requests: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [requests.append]})
    with Client(url, KEY, http_client=http) as c:
        turns = ({"turn_id": str(i), "user": f"line {i}", "timestamp": "2024-03-01T00:00:00Z"} for i in range(25))
        ids = c.store_turns_batched(conv, turns, batch_size=10, wait=True)
        assert len(ids) == len(set(ids)) == 25
        assert [len(json.loads(r.content)["turns"]) for r in requests] == [10, 10, 5]
        assert c.conversation_info(conv).turns == 25
    http.close()


def test_list_turns_pages_in_order(client, conv):
    turns = [{"turn_id": f"t{i}", "user": f"Day {i}: we hiked to the lighthouse.", "timestamp": f"2024-05-0{i + 1}T10:00:00Z"}
             for i in range(7)]
    ids = client.store_turns(conv, turns, wait=True).memory_ids
    first = client.list_turns(conv, limit=3)
    assert isinstance(first, TurnPage) and first.next_cursor
    assert [t.turn_id for t in first.turns] == ["t0", "t1", "t2"]
    second = client.list_turns(conv, limit=3, cursor=first.next_cursor)
    assert [t.position for t in second.turns] == [3, 4, 5]
    last = client.list_turns(conv, limit=3, cursor=second.next_cursor)
    assert [t.position for t in last.turns] == [6] and last.next_cursor is None
    walked = list(client.iter_turns(conv, page_size=2))
    assert [t.memory_id for t in walked] == ids
    assert all(t.extraction is not None and "lighthouse" in {k.text for k in t.extraction.keywords} for t in walked)


def test_list_conversations_pages_in_ascending_order(client, conv):
    mine = [f"{conv}-{c}" for c in "cab"]
    try:
        for c in mine:
            client.store_turn(c, "listed", wait=True)
        listed = list(client.iter_conversations(page_size=2))
        assert listed == sorted(listed) and len(listed) == len(set(listed))
        assert [c for c in listed if c.startswith(conv)] == sorted(mine)
        page = client.list_conversations(limit=1)
        assert len(page.conversations) == 1 and page.next_cursor
        nxt = client.list_conversations(limit=1, cursor=page.next_cursor)
        assert nxt.conversations[0] > page.conversations[0]
    finally:
        for c in mine:
            client.delete_conversation(c)


def test_listing_errors(client, other_client, conv):
    client.store_turn(conv, "one turn", wait=True)
    for kwargs, needle in (({"limit": 0}, "limit"), ({"limit": 501}, "limit"), ({"cursor": "garbage"}, "cursor")):
        with pytest.raises(BadRequestError) as e:
            client.list_turns(conv, **kwargs)
        assert e.value.code == "invalid_argument" and e.value.message.startswith(needle)
    # a cursor of the conversations listing is not one of the turns listing
    other_listing = client.list_conversations(limit=1)
    if other_listing.next_cursor:
        with pytest.raises(BadRequestError):
            client.list_turns(conv, cursor=other_listing.next_cursor)
    with pytest.raises(NotFoundError):
        list(client.iter_turns(conv + "-missing"))
    # another tenant sees neither the conversation nor its turns
    with pytest.raises(NotFoundError):
        other_client.list_turns(conv)
    assert conv not in list(other_client.iter_conversations())


def test_recall_filters_by_conversation(client, conv):
    other = conv + "-b"
    try:
        client.store_turn(conv, "My sister lives in Lisbon.", wait=True)
        client.store_turn(other, "My brother moved to Lisbon too.", wait=True)
        both = client.recall("who lives in Lisbon?", k=10)
        assert {conv, other} <= {m.conversation_id for m in both.memories}
        only = client.recall("who lives in Lisbon?", conversation_ids=[other], k=10)
        assert {m.conversation_id for m in only.memories} == {other}
    finally:
        client.delete_conversation(other)


def test_recall_takes_now_and_attention_state(client, conv):
    client.store_turn(conv, "We went hiking at Mount Tam last Saturday.", timestamp="2024-05-13T09:00:00Z", wait=True)
    state = {
        "entities": ["Mount Tam"],
        "locations": ["Mount Tam"],
        "events": [],
        "times": [{"text": "last Saturday", "start": "2024-05-11", "end": "2024-05-11", "granularity": "day"}],
        "bindings": {},
        "turns_seen": 1,
    }
    hits = client.recall(
        "where did we go hiking last week?",
        conversation_ids=[conv],
        k=3,
        attention_state=state,
        now=datetime(2024, 5, 15, tzinfo=timezone.utc),
    )
    assert hits.memories and "Mount Tam" in hits.memories[0].user


def test_ids_with_every_allowed_character(client):
    cid = f"chat:{uuid.uuid4().hex[:8]}@team.a_b-c"
    mid = client.store_turn(cid, "an id with punctuation", wait=True)
    assert client.get_memory(mid).conversation_id == cid
    assert client.conversation_info(cid).turns == 1
    assert client.delete_conversation(cid).turns_erased == 1


def test_delete_conversation_erases_everything(client, conv):
    ids = client.store_turns(conv, README_TURNS, wait=True).memory_ids
    erased = client.delete_conversation(conv)
    assert (erased.conversation_id, erased.turns_erased) == (conv, 2)
    with pytest.raises(NotFoundError) as e:
        client.conversation_info(conv)
    assert e.value.status == 404 and e.value.code == "not_found" and conv in e.value.message
    with pytest.raises(NotFoundError):
        client.get_memory(ids[0])
    with pytest.raises(NotFoundError):
        client.recall("Melanie", conversation_ids=[conv])


def test_erase_tenant(url):
    with Client(url, ERASE_KEY) as c:
        c.store_turns("e-1", README_TURNS, wait=True)
        c.store_turn("e-2", "one more", wait=True)
        with pytest.raises(BadRequestError) as e:
            c.erase_tenant("someone-else")
        assert e.value.status == 400 and "confirm" in e.value.message
        erased = c.erase_tenant(ERASE_TENANT)
        assert (erased.conversations_erased, erased.turns_erased) == (2, 3)
        assert c.recall("Melanie", k=5).memories == []
    with pytest.raises(ValueError):
        Client(url, ERASE_KEY).erase_tenant("")


def test_tenants_are_isolated(client, other_client, conv):
    mid = client.store_turn(conv, "The vault code is 4711.", wait=True)
    with pytest.raises(NotFoundError):
        other_client.get_memory(mid)
    with pytest.raises(NotFoundError):
        other_client.conversation_info(conv)
    assert all(m.memory_id != mid for m in other_client.recall("vault code", k=50).memories)


def test_operations_endpoints(client):
    assert client.healthz().strip() == "ok"
    assert client.readyz().strip() == "ready"
    assert client.is_ready()
    client.wait_until_ready(timeout=5)
    metrics = client.metrics()
    assert "recollect_http_requests_total" in metrics and "recollect_build_info" in metrics
    doc = client.openapi()
    assert doc["openapi"].startswith("3.1")
    # The live document is the committed snapshot the models were generated from.
    assert doc == json.loads(SNAPSHOT.read_text())


def test_not_ready_when_nothing_listens():
    c = Client("http://127.0.0.1:9", max_retries=0, timeout=2)
    assert not c.is_ready()
    with pytest.raises(TimeoutError):
        c.wait_until_ready(timeout=0.3)


# ---- error paths ---------------------------------------------------------------------------------


def test_unknown_key_is_401(url):
    with Client(url, "not-a-key") as c:
        with pytest.raises(AuthenticationError) as e:
            c.recall("anything")
    err = e.value
    assert (err.status, err.code, err.message) == (401, "unauthenticated", "unknown API key")
    assert err.method == "POST" and err.url.endswith("/v1/recall")
    assert str(err) == f"401 unauthenticated: unknown API key (POST {err.url})"


def test_missing_key_is_401(url, monkeypatch):
    monkeypatch.delenv("RECOLLECT_API_KEY", raising=False)
    with Client(url) as c:
        with pytest.raises(AuthenticationError) as e:
            c.conversation_info("x")
    assert "Authorization" in e.value.message


def test_key_from_environment(url, monkeypatch, conv):
    monkeypatch.setenv("RECOLLECT_API_KEY", KEY)
    monkeypatch.setenv("RECOLLECT_URL", url)
    with Client() as c:
        assert c.base_url == url and c.api_key == KEY
        c.store_turn(conv, "configured from the environment", wait=True)
        assert c.conversation_info(conv).turns == 1


def test_invalid_input_is_400_naming_the_field(client, conv):
    with pytest.raises(BadRequestError) as e:
        client.store_turns(conv, [{"user": "   ", "timestamp": "2024-01-01T00:00:00Z"}])
    assert (e.value.status, e.value.code) == (400, "invalid_argument")
    assert "turns[0].user" in e.value.message
    with pytest.raises(BadRequestError) as e:
        client.recall("x", k=0)
    assert "k must be in 1..=1000" in e.value.message
    with pytest.raises(BadRequestError) as e:
        client.store_turn("not a valid id", "hello")
    assert "conversation id" in e.value.message
    with pytest.raises(BadRequestError) as e:
        client.store_turns(conv, [])
    assert "at least one turn" in e.value.message
    # nothing was stored by any of them
    with pytest.raises(NotFoundError):
        client.conversation_info(conv)


def test_unknown_fields_are_refused_by_the_server(client):
    with pytest.raises(BadRequestError) as e:
        client.request("POST", "/v1/recall", json={"query": "x", "tenant": "someone-else"})
    assert e.value.code == "invalid_argument" and "unknown field `tenant`" in e.value.message


def test_request_helper_returns_the_response(client, conv):
    client.store_turn(conv, "raw access", wait=True)
    resp = client.request("GET", f"/v1/conversations/{conv}")
    assert resp.status_code == 200 and resp.json()["turns"] == 1


def test_not_a_memory_id_is_400_and_unknown_one_404(client):
    with pytest.raises(BadRequestError) as e:
        client.get_memory("abc")
    assert "not a memory id" in e.value.message
    with pytest.raises(NotFoundError):
        client.get_memory(str(uuid.uuid4()))


def test_models_validate_before_sending(client, conv):
    with pytest.raises(pydantic.ValidationError):  # naive timestamp: the server needs an offset
        TurnInput(user="x", timestamp=datetime(2024, 1, 1))
    with pytest.raises(pydantic.ValidationError):  # unknown field, as the server would refuse
        client.store_turns(conv, [{"user": "x", "timestamp": "2024-01-01T00:00:00Z", "mood": "happy"}])
    with pytest.raises(ValueError):
        client.get_memory("")


def test_a_success_that_breaks_the_schema_is_unexpected(mock):
    from conftest import Reply

    mock.script(Reply(200, {"conversation_id": "c", "turns": "many"}), Reply(200, raw=b"<html>"))
    with Client(mock.url, "k") as c:
        with pytest.raises(UnexpectedResponseError) as e:
            c.conversation_info("c")
        assert "ConversationInfo" in str(e.value) and e.value.status == 200
        with pytest.raises(UnexpectedResponseError):
            c.conversation_info("c")


def test_headers_sent(mock):
    from conftest import Reply

    mock.script(Reply(200, INFO_OK))
    with Client(mock.url, "secret", headers={"x-request-id": "r-1"}) as c:
        c.conversation_info("c")
    h = {k.lower(): v for k, v in mock.seen[0].headers.items()}
    assert h["authorization"] == "Bearer secret"
    assert h["x-request-id"] == "r-1"
    assert h["user-agent"].startswith("recollect-memory-client-python/")
    assert "secret" not in repr(c)


def test_edit_history_and_as_of_on_the_wire(mock):
    """What edit_memory, memory_history and as_of send, what they parse, and their errors."""
    from conftest import MEMORY_ID, TURN_V1, TURN_V2, Reply, error

    mock.script(
        Reply(503, error("unavailable", "raw store busy")),  # an edit is retried: the same one again is no new version
        Reply(202, TURN_V2),
        Reply(202, TURN_V2),
        Reply(200, {"memory_id": MEMORY_ID, "versions": [TURN_V1, TURN_V2]}),
        Reply(200, {**TURN_V1, "fragments": []}),
        Reply(200, {"memories": []}),
        Reply(400, error("invalid_argument", "patch.user is empty or whitespace")),
        Reply(404, error("not_found", f"memory {MEMORY_ID} not found as of 2020-01-01T00:00:00+00:00")),
    )
    as_of = datetime(2026, 11, 24, 9, 40, 38, 250000, tzinfo=timezone(timedelta(hours=1)))
    with Client(mock.url, "k", retry=RetryPolicy(max_retries=1, backoff=0.01)) as c:
        v2 = c.edit_memory(MEMORY_ID, user="I like sailing", metadata={"b": 2})
        assert isinstance(v2, Turn) and v2.version == 2 and v2.user == "I like sailing"
        assert v2.metadata == {"b": 2} and v2.expired_at is None
        assert v2.first_recorded_at == datetime(2026, 11, 24, 8, 40, 38, 191033, tzinfo=timezone.utc)
        c.edit_memory(MEMORY_ID, assistant="", wait=True)
        history = c.memory_history(MEMORY_ID)
        assert isinstance(history, MemoryHistory) and history.memory_id == MEMORY_ID
        assert [v.user for v in history.versions] == ["I like kayaking", "I like sailing"]
        assert history.versions[0].version is None and history.versions[0].expired_at == v2.recorded_at
        then = c.get_memory(MEMORY_ID, as_of=as_of)
        assert isinstance(then, TurnView) and then.user == "I like kayaking"
        c.recall("sailing", as_of=as_of)
        with pytest.raises(BadRequestError) as e:
            c.edit_memory(MEMORY_ID, user="")
        assert e.value.status == 400 and "patch.user" in e.value.message
        with pytest.raises(NotFoundError):
            c.get_memory(MEMORY_ID, as_of="2020-01-01T00:00:00Z")

    path = f"/v1/memories/{MEMORY_ID}"
    assert [(s.method, urlsplit(s.path).path) for s in mock.seen] == [
        ("PATCH", path),
        ("PATCH", path),
        ("PATCH", path),
        ("GET", f"{path}/history"),
        ("GET", path),
        ("POST", "/v1/recall"),
        ("PATCH", path),
        ("GET", path),
    ]
    bodies = [json.loads(s.body) if s.body else None for s in mock.seen]
    # Only what was given; `wait` only when asked for; "" (remove the assistant's text) is sent.
    assert bodies[0] == bodies[1] == {"user": "I like sailing", "metadata": {"b": 2}}
    assert bodies[2] == {"assistant": "", "wait": True}
    assert bodies[3] is None and bodies[4] is None
    assert datetime.fromisoformat(bodies[5]["as_of"]) == as_of
    # The offset's "+" is percent-encoded: a raw one would reach the server as a space (a 400).
    query = urlsplit(mock.seen[4].path).query
    assert "+" not in query and datetime.fromisoformat(parse_qs(query)["as_of"][0]) == as_of
    assert parse_qs(urlsplit(mock.seen[7].path).query) == {"as_of": ["2020-01-01T00:00:00Z"]}
