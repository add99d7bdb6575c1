"""Retries, Retry-After, timeouts and transport failures: against the rate-limited live server
where the server can produce them (429, 413), against a scripted mock server for the rest."""

from __future__ import annotations

import email.utils
import json
import socket
import time

import pytest
from conftest import BIG_KEY, INFO_OK, LIMITED_KEY, RECALL_OK, STORE_OK, Reply, error

from recollect_client import (
    BadRequestError,
    Client,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    RecollectConnectionError,
    RecollectTimeoutError,
    RetryPolicy,
    ServerError,
    ServiceUnavailableError,
    parse_retry_after,
)


def drain(c: Client) -> None:
    """Empty the tenant's one-token bucket so that the next request is refused."""
    for _ in range(5):
        try:
            c.recall("drain the bucket")
        except RateLimitError:
            return
    raise AssertionError("the limited server never answered 429")


# ---- live: the rate-limited server (1 request/s per tenant, burst 1) ------------------------------


def test_429_without_retries_carries_code_message_and_retry_after(limited_url):
    with Client(limited_url, LIMITED_KEY, max_retries=0) as c:
        drain(c)
        with pytest.raises(RateLimitError) as e:
            c.recall("again at once")
    err = e.value
    assert err.status == 429 and err.code == "rate_limited"
    assert "too many requests" in err.message
    assert err.retry_after == 1.0


def test_429_is_retried_after_retry_after(limited_url):
    with Client(limited_url, LIMITED_KEY, max_retries=0) as c:
        drain(c)
    with Client(limited_url, LIMITED_KEY, max_retries=3) as c:
        start = time.monotonic()
        c.recall("first, after waiting for a token")
        c.recall("second, after waiting again")
        elapsed = time.monotonic() - start
    # each call waited out at least one Retry-After of 1 s
    assert elapsed >= 1.9, elapsed


def test_429_retries_are_bounded(limited_url):
    # A store without turn_ids is not idempotent, but a 429 is refused before any work: retried.
    with Client(limited_url, LIMITED_KEY, retry=RetryPolicy(max_retries=1, max_retry_after=0.5)) as c:
        drain(c)
        start = time.monotonic()
        with pytest.raises(RateLimitError) as e:
            c.store_turn("limited", "not now")  # Retry-After 1 s exceeds the 0.5 s we accept
        assert time.monotonic() - start < 0.5
        assert e.value.retry_after == 1.0


def test_413_payload_too_large(limited_url):
    with Client(limited_url, BIG_KEY) as c:
        with pytest.raises(PayloadTooLargeError) as e:
            c.recall("x" * 5000)
    assert isinstance(e.value, BadRequestError)
    assert (e.value.status, e.value.code) == (413, "too_large")


# ---- mock server ----------------------------------------------------------------------------------


def test_503_overloaded_is_retried_even_for_a_store(mock):
    mock.script(Reply(503, error("overloaded", "at the in-flight limit"), {"retry-after": "1"}), Reply(202, STORE_OK))
    with Client(mock.url, "k") as c:
        start = time.monotonic()
        mid = c.store_turn("c", "hello")
        elapsed = time.monotonic() - start
    assert mid == STORE_OK["memory_ids"][0]
    assert len(mock.seen) == 2 and elapsed >= 0.95
    assert mock.seen[1].at - mock.seen[0].at >= 0.95
    assert json.loads(mock.seen[0].body) == json.loads(mock.seen[1].body)


def test_other_503_is_not_retried_for_a_store_without_turn_ids(mock):
    mock.script(Reply(503, error("unavailable", "stored, enrichment did not finish"), {"retry-after": "1"}))
    with Client(mock.url, "k") as c:
        with pytest.raises(ServiceUnavailableError) as e:
            c.store_turn("c", "hello", wait=True)
    assert len(mock.seen) == 1
    assert (e.value.code, e.value.retry_after) == ("unavailable", 1.0)


def test_other_503_is_retried_for_idempotent_calls(mock):
    unavailable = Reply(503, error("unavailable", "graph store down"), {"retry-after": "0"})
    mock.script(unavailable, Reply(202, STORE_OK), unavailable, Reply(200, RECALL_OK))
    with Client(mock.url, "k") as c:
        assert c.store_turn("c", "hello", turn_id="t1") == STORE_OK["memory_ids"][0]
        assert c.recall("q").memories == []
    assert len(mock.seen) == 4


def test_retry_after_as_http_date(mock):
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    mock.script(Reply(429, error("rate_limited", "slow down"), {"retry-after": when}), Reply(200, INFO_OK))
    with Client(mock.url, "k") as c:
        start = time.monotonic()
        c.conversation_info("c")
    # whole-second HTTP dates: between 1 and 2 s from now
    assert 0.9 <= time.monotonic() - start <= 3.5


def test_retry_after_beyond_the_cap_raises_at_once(mock):
    mock.script(Reply(429, error("rate_limited", "slow down"), {"retry-after": "120"}))
    with Client(mock.url, "k") as c:
        start = time.monotonic()
        with pytest.raises(RateLimitError) as e:
            c.recall("q")
    assert time.monotonic() - start < 1 and len(mock.seen) == 1
    assert e.value.retry_after == 120.0


def test_attempts_are_bounded(mock):
    mock.script(Reply(429, error("rate_limited", "slow down"), {"retry-after": "0"}))
    with Client(mock.url, "k", max_retries=2) as c:
        with pytest.raises(RateLimitError):
            c.recall("q")
    assert len(mock.seen) == 3


def test_no_retry_after_falls_back_to_backoff(mock):
    mock.script(Reply(503, error("overloaded", "busy")), Reply(503, error("overloaded", "busy")), Reply(200, INFO_OK))
    policy = RetryPolicy(max_retries=3, backoff=0.2, max_backoff=0.2)
    with Client(mock.url, "k", retry=policy) as c:
        c.conversation_info("c")
    gaps = [b.at - a.at for a, b in zip(mock.seen, mock.seen[1:])]
    assert len(gaps) == 2 and all(0.09 <= g <= 1.0 for g in gaps), gaps


def test_client_errors_are_never_retried(mock):
    mock.script(Reply(404, error("not_found", "conversation \"c\" not found")))
    with Client(mock.url, "k") as c:
        with pytest.raises(NotFoundError) as e:
            c.conversation_info("c")
    assert len(mock.seen) == 1 and e.value.message == 'conversation "c" not found'


def test_non_json_5xx_from_a_proxy(mock):
    mock.script(Reply(502, raw=b"Bad Gateway from the ingress"), Reply(200, INFO_OK))
    with Client(mock.url, "k", retry=RetryPolicy(backoff=0.01)) as c:
        assert c.conversation_info("c").turns == 1  # idempotent: retried
        mock.script(Reply(502, raw=b"Bad Gateway from the ingress"))
        with pytest.raises(ServerError) as e:
            c.store_turn("c", "x")  # not idempotent: raised
    assert (e.value.status, e.value.code) == (502, "http_502")
    assert e.value.message == "Bad Gateway from the ingress"


def test_timeout_is_typed_and_retried_only_when_idempotent(mock):
    mock.script(Reply(200, INFO_OK, delay=1.0))
    with Client(mock.url, "k", timeout=0.2, retry=RetryPolicy(max_retries=1, backoff=0.01)) as c:
        with pytest.raises(RecollectTimeoutError):
            c.conversation_info("c")
        assert len(mock.seen) == 2
        with pytest.raises(RecollectTimeoutError):
            c.store_turn("c", "maybe stored, so not repeated")
        assert len(mock.seen) == 3
        # a per-call timeout overrides the client's
        assert c.conversation_info("c", timeout=3).turns == 1


def test_connection_refused_is_retried_then_typed():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens
    with Client(f"http://127.0.0.1:{port}", "k", retry=RetryPolicy(max_retries=2, backoff=0.05)) as c:
        start = time.monotonic()
        with pytest.raises(RecollectConnectionError) as e:
            c.store_turn("c", "never sent, so safe to retry")
    assert "ConnectError" in str(e.value) and time.monotonic() - start >= 0.05


def test_parse_retry_after():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-4") == 0.0
    now = 1_700_000_000.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
