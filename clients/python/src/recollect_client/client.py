"""The synchronous client."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx

from . import errors
from ._base import DEFAULT_TIMEOUT, DEFAULT_WAIT_TIMEOUT, BaseClient, Call, RetryPolicy, TurnLike, chunks, utc_now
from .models import (
    ConversationInfo,
    ConversationPage,
    Erased,
    MemoryErased,
    MemoryHistory,
    RecallResponse,
    ReferenceState,
    Reindexing,
    StoreResponse,
    TenantErased,
    Turn,
    TurnInput,
    TurnPage,
    TurnView,
)
from .pagination import Page, iter_items


class Client(BaseClient):
    """Synchronous client of a Recollect server's HTTP API.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8080`` (default: ``$RECOLLECT_URL``, else that).
        api_key: sent as ``Authorization: Bearer KEY``; the tenant comes from it (default:
            ``$RECOLLECT_API_KEY``; none for a server running open on loopback).
        timeout: seconds (or an ``httpx.Timeout``) per attempt; every method also takes ``timeout=``.
        wait_timeout: the read timeout of ``store_turns(..., wait=True)``, which the server holds
            until the turns are recallable.
        max_retries: retries on 429/503 (honouring Retry-After) and transport failures; see
            :class:`RetryPolicy` for what is retried when. ``retry=`` takes a whole policy.
        headers: extra headers on every request.
        http_client: an ``httpx.Client`` of your own (proxies, TLS, transports); not closed by
            :meth:`close`.

    Errors are raised as :mod:`recollect_client.errors` exceptions carrying the server's error
    code and message. Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        max_retries: int = 3,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key,
            timeout=timeout,
            wait_timeout=wait_timeout,
            max_retries=max_retries,
            retry=retry,
            headers=headers,
        )
        self._own_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)

    def close(self) -> None:
        if self._own_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call) -> Any:
        attempt = 0
        while True:
            request = self._build(self._http, call)
            try:
                resp = self._http.send(request)
            except httpx.TransportError as exc:
                time.sleep(self._transport_outcome(call, exc, attempt))
                attempt += 1
                continue
            result, delay, _ = self._outcome(call, resp, attempt)
            if delay is None:
                return result
            time.sleep(delay)
            attempt += 1

    # ---- store ---------------------------------------------------------------------------------

    def store_turns(
        self,
        conversation_id: str,
        turns: Sequence[TurnLike],
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> StoreResponse:
        """``POST /v1/conversations/{id}/turns``: store a batch of turns (``TurnInput`` or dicts
        with ``user``, ``timestamp`` and optionally ``turn_id``, ``assistant``, ``user_speaker``,
        ``assistant_speaker``, ``metadata``, ``user_id``, ``agent_id``). Answers once they are
        durable; with ``wait=True`` once they are recallable. Returns one memory id per turn, in
        order."""
        return self._send(self._store_turns_call(conversation_id, turns, wait, timeout))

    def store_turn(
        self,
        conversation_id: str,
        user: str,
        assistant: str | None = None,
        *,
        timestamp: datetime | str | None = None,
        turn_id: str | None = None,
        user_speaker: str | None = None,
        assistant_speaker: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> str:
        """Store one turn (``timestamp`` defaults to now, UTC) and return its memory id.
        ``user_id``/``agent_id``: the end user and agent it belongs to (recall and the
        conversation listing can be scoped to them)."""
        turn = TurnInput(
            turn_id=turn_id,
            user=user,
            assistant=assistant,
            user_speaker=user_speaker,
            assistant_speaker=assistant_speaker,
            timestamp=timestamp if timestamp is not None else utc_now(),
            metadata=dict(metadata) if metadata is not None else None,
            user_id=user_id,
            agent_id=agent_id,
        )
        return self.store_turns(conversation_id, [turn], wait=wait, timeout=timeout).memory_ids[0]

    def store_turns_batched(
        self,
        conversation_id: str,
        turns: Iterable[TurnLike],
        *,
        batch_size: int = 500,
        wait: bool = False,
        timeout: float | None = None,
    ) -> list[str]:
        """Store any number of turns in requests of ``batch_size`` (the server takes at most
        ``max_turns_per_request``, 1000 by default), in order; returns every memory id. A failing
        batch raises; the batches before it stay stored (send ``turn_id``s to make a rerun safe)."""
        ids: list[str] = []
        for batch in chunks(turns, batch_size):
            ids.extend(self.store_turns(conversation_id, batch, wait=wait, timeout=timeout).memory_ids)
        return ids

    # ---- query ---------------------------------------------------------------------------------

    def recall(
        self,
        query: str,
        *,
        conversation_ids: Sequence[str] | None = None,
        k: int | None = None,
        attention_state: ReferenceState | Mapping[str, Any] | None = None,
        now: datetime | str | None = None,
        user_ids: Sequence[str] | None = None,
        agent_ids: Sequence[str] | None = None,
        from_: datetime | str | None = None,
        to: datetime | str | None = None,
        speakers: Sequence[str] | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
        as_of: datetime | str | None = None,
        timeout: float | None = None,
    ) -> RecallResponse:
        """``POST /v1/recall``: the ``k`` (1..1000, default 30) memories best matching ``query``,
        best first, each with its ``score``, ``sources`` and ``score_parts``. ``conversation_ids``
        narrows the search (default: every conversation of the tenant); ``now`` anchors relative
        times in the query ("last week"). Filters, applied inside every retrieval path so ``k``
        matching turns come back whenever that many exist: ``user_ids``, ``agent_ids``, a time
        range on the turn's timestamp (``from_`` inclusive, sent as ``from``; ``to`` exclusive),
        ``speakers`` and ``metadata`` equality (string, number or boolean values). ``as_of``: what
        was held at that transaction time (each turn's version then; nothing recorded later)."""
        return self._send(
            self._recall_call(
                query,
                conversation_ids,
                k,
                attention_state,
                now,
                timeout,
                user_ids=user_ids,
                agent_ids=agent_ids,
                from_=from_,
                to=to,
                speakers=speakers,
                metadata=metadata,
                as_of=as_of,
            )
        )

    def get_memory(
        self, memory_id: str, *, as_of: datetime | str | None = None, timeout: float | None = None
    ) -> TurnView:
        """``GET /v1/memories/{id}``: one stored turn, with its ``extraction`` (keywords, entities,
        locations, times, references; ``None`` while enrichment is pending) and ``fragments``;
        with ``as_of``, the version held at that time."""
        return self._send(self._get_memory_call(memory_id, timeout, as_of))

    def edit_memory(
        self,
        memory_id: str,
        *,
        user: str | None = None,
        assistant: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> Turn:
        """``PATCH /v1/memories/{id}``: a new version of the turn (its text or metadata; at least
        one); the old one is kept, expired, in its history. Returns the version now current
        (``wait=True``: once it is recallable). The same edit again makes no new version."""
        return self._send(self._edit_memory_call(memory_id, user, assistant, metadata, wait, timeout))

    def memory_history(self, memory_id: str, *, timeout: float | None = None) -> MemoryHistory:
        """``GET /v1/memories/{id}/history``: every version, oldest first (each replaced one
        with ``expired_at``)."""
        return self._send(self._memory_history_call(memory_id, timeout))

    def get_memories(self, memory_ids: Iterable[str], *, timeout: float | None = None) -> list[TurnView]:
        """Several stored turns, in the order given (one request each; a missing one raises
        :class:`~recollect_client.errors.NotFoundError`)."""
        return [self.get_memory(m, timeout=timeout) for m in memory_ids]

    def conversation_info(self, conversation_id: str, *, timeout: float | None = None) -> ConversationInfo:
        """``GET /v1/conversations/{id}``: stored, pending and recallable turn counts."""
        return self._send(self._conversation_info_call(conversation_id, timeout))

    # ---- listings (cursor-paged) ---------------------------------------------------------------

    def list_conversations(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        timeout: float | None = None,
    ) -> ConversationPage:
        """``GET /v1/conversations``: one page of the tenant's conversation ids, ascending;
        ``limit`` 1..500 (server default 50); pass the page's ``next_cursor`` for the next one.
        ``user_id``/``agent_id``: only the conversations with a turn of that end user/agent."""
        return self._send(self._list_conversations_call(limit, cursor, timeout, user_id, agent_id))

    def iter_conversations(
        self,
        *,
        page_size: int | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        timeout: float | None = None,
    ) -> Iterator[str]:
        """Every conversation id of the tenant (or of one end user/agent), page after page."""

        def fetch(cursor: str | None) -> Page[str]:
            page = self.list_conversations(
                limit=page_size, cursor=cursor, user_id=user_id, agent_id=agent_id, timeout=timeout
            )
            return Page(page.conversations, page.next_cursor)

        return iter_items(fetch)

    def list_turns(
        self,
        conversation_id: str,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        timeout: float | None = None,
    ) -> TurnPage:
        """``GET /v1/conversations/{id}/turns``: one page of the conversation's turns in order,
        each with its extraction; pass the page's ``next_cursor`` for the next one."""
        return self._send(self._list_turns_call(conversation_id, limit, cursor, timeout))

    def iter_turns(
        self, conversation_id: str, *, page_size: int | None = None, timeout: float | None = None
    ) -> Iterator[TurnView]:
        """Every turn of a conversation in order, page after page (a missing conversation raises
        :class:`~recollect_client.errors.NotFoundError` when iteration starts)."""

        def fetch(cursor: str | None) -> Page[TurnView]:
            page = self.list_turns(conversation_id, limit=page_size, cursor=cursor, timeout=timeout)
            return Page(page.turns, page.next_cursor)

        return iter_items(fetch)

    # ---- erase ---------------------------------------------------------------------------------

    def delete_conversation(self, conversation_id: str, *, timeout: float | None = None) -> Erased:
        """``DELETE /v1/conversations/{id}``: erase the conversation from every store."""
        return self._send(self._delete_conversation_call(conversation_id, timeout))

    def delete_memory(self, memory_id: str, *, timeout: float | None = None) -> MemoryErased:
        """``DELETE /v1/memories/{id}``: erase one turn from every store; the rest of its
        conversation stays recallable. Raises :class:`~recollect_client.errors.NotFoundError` for
        an id this tenant does not have (or no longer has)."""
        return self._send(self._delete_memory_call(memory_id, timeout))

    def reindex(self, *, timeout: float | None = None) -> Reindexing:
        """``POST /v1/reindex``: every turn of the tenant derived again (after an extractor, rule
        or model change); recall goes on meanwhile."""
        return self._send(self._reindex_call(timeout))

    def erase_tenant(self, confirm: str, *, timeout: float | None = None) -> TenantErased:
        """``DELETE /v1/tenant?confirm=TENANT``: erase every conversation of the caller's tenant.
        ``confirm`` must repeat the tenant name the API key maps to."""
        return self._send(self._erase_tenant_call(confirm, timeout))

    # ---- operations ----------------------------------------------------------------------------

    def healthz(self, *, timeout: float | None = None) -> str:
        """``GET /healthz``: liveness."""
        return self._send(self._healthz_call(timeout))

    def readyz(self, *, timeout: float | None = None) -> str:
        """``GET /readyz``: raises :class:`~recollect_client.errors.ServiceUnavailableError`
        naming the stores that do not answer when the server is not ready."""
        return self._send(self._readyz_call(timeout))

    def is_ready(self, *, timeout: float | None = None) -> bool:
        """Whether ``/readyz`` answers 200 (connection failures count as not ready)."""
        try:
            self.readyz(timeout=timeout)
            return True
        except (errors.APIError, errors.TransportError):
            return False

    def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.1) -> None:
        """Poll ``/readyz`` until it answers 200; raises ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.is_ready(timeout=min(5.0, timeout)):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.base_url} not ready within {timeout}s")
            time.sleep(interval)

    def metrics(self, *, timeout: float | None = None) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        return self._send(self._metrics_call(timeout))

    def openapi(self, *, timeout: float | None = None) -> dict:
        """``GET /openapi.json``: the server's OpenAPI 3.1 document."""
        return self._send(self._openapi_call(timeout))

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        idempotent: bool | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """Any request, with this client's auth, retries and typed errors; returns the 2xx
        response. ``idempotent`` (default: by method) decides what may be retried."""
        return self._send(self._raw_call(method, path, json, params, idempotent, timeout))
