"""Fixtures: a live recollect server (started by scripts/test-clients.sh) and a scripted mock
server for the retry and timeout paths a real server cannot be made to produce on demand.

Environment (set by scripts/test-clients.sh):
    RECOLLECT_TEST_URL          a server with keys py-key:py, py-other:py-other, py-erase:py-erase
    RECOLLECT_TEST_LIMITED_URL  a server with rate_limit_per_sec=1, burst=1, max_body_bytes=4096
                                and keys py-limited:py-limited, py-big:py-big
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from recollect_client import AsyncClient, Client

KEY = "py-key"
TENANT = "py"
OTHER_KEY = "py-other"
ERASE_KEY, ERASE_TENANT = "py-erase", "py-erase"
LIMITED_KEY = "py-limited"
BIG_KEY = "py-big"


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.skip(f"{name} not set: run scripts/test-clients.sh, which starts the servers")
    return value


@pytest.fixture(scope="session")
def url() -> str:
    return _env("RECOLLECT_TEST_URL")


@pytest.fixture(scope="session")
def limited_url() -> str:
    return _env("RECOLLECT_TEST_LIMITED_URL")


@pytest.fixture
def client(url):
    with Client(url, KEY) as c:
        yield c


@pytest.fixture
def other_client(url):
    with Client(url, OTHER_KEY) as c:
        yield c


@pytest.fixture
async def aclient(url):
    async with AsyncClient(url, KEY) as c:
        yield c


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def conv(url):
    """A fresh conversation id, erased after the test."""
    cid = f"py-{uuid.uuid4().hex[:16]}"
    yield cid
    with Client(url, KEY) as c:
        try:
            c.delete_conversation(cid)
        except Exception:
            pass


@dataclass
class Reply:
    status: int = 200
    body: object = None
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    raw: bytes | None = None


@dataclass
class Seen:
    method: str
    path: str
    headers: dict
    body: bytes
    at: float


class MockServer:
    """Answers each request with the next scripted :class:`Reply` (the last one repeats) and
    records what it received."""

    def __init__(self) -> None:
        self.replies: queue.Queue[Reply] = queue.Queue()
        self.last = Reply(200, {})
        self.seen: list[Seen] = []
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                mock.seen.append(Seen(self.command, self.path, dict(self.headers), body, time.monotonic()))
                try:
                    reply = mock.replies.get_nowait()
                    mock.last = reply
                except queue.Empty:
                    reply = mock.last
                if reply.delay:
                    time.sleep(reply.delay)
                data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    ctype = "application/json" if reply.raw is None else "text/plain"
                    headers = {"content-type": ctype, **reply.headers}
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def script(self, *replies: Reply) -> None:
        for r in replies:
            self.replies.put(r)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mock():
    m = MockServer()
    yield m
    m.close()


def error(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


RECALL_OK = {"memories": []}
STORE_OK = {"memory_ids": ["9ad96c05-5fd4-43fe-a707-07b985b77fb1"]}
INFO_OK = {"conversation_id": "c", "turns": 1, "pending": 0, "recallable": 1}

# A memory edited once, as the server answers for it: version 1 (expired; `version` left out at 1)
# and version 2 (current, with `first_recorded_at`).
MEMORY_ID = "94136752-401a-4159-b7f0-655356953cfa"
TURN_V1 = {
    "memory_id": MEMORY_ID,
    "tenant": "t",
    "conversation_id": "c",
    "turn_id": "0",
    "position": 0,
    "user": "I like kayaking",
    "assistant": "nice",
    "timestamp": "2024-01-01T00:00:00Z",
    "recorded_at": "2026-11-24T08:40:38.191033Z",
    "metadata": {"a": 1},
    "expired_at": "2026-11-24T08:40:38.311248Z",
}
TURN_V2 = {
    **{k: v for k, v in TURN_V1.items() if k != "expired_at"},
    "user": "I like sailing",
    "recorded_at": "2026-11-24T08:40:38.311248Z",
    "metadata": {"b": 2},
    "version": 2,
    "first_recorded_at": "2026-11-24T08:40:38.191033Z",
}

README_TURNS = [
    {
        "user": "I went to the LGBTQ support group yesterday, it was so powerful.",
        "assistant": "That sounds inspiring! What happened there?",
        "user_speaker": "Caroline",
        "assistant_speaker": "Melanie",
        "timestamp": "2023-05-08T13:56:00Z",
    },
    {
        "user": "I painted a sunrise over the lake last week.",
        "assistant": "Lovely! Painting by the lake must be calming.",
        "user_speaker": "Melanie",
        "assistant_speaker": "Caroline",
        "timestamp": "2023-05-08T14:01:00Z",
    },
]
