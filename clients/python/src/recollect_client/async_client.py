"""The asynchronous client: the same operations as :class:`recollect_client.Client`, awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
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
from .pagination import Page, aiter_items


class AsyncClient(BaseClient):
    """Asynchronous client of a Recollect server's HTTP API (``httpx.AsyncClient``); arguments,
    retries and errors as :class:`recollect_client.Client`. Use ``async with``, or ``await
    aclose()``."""

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
        http_client: httpx.AsyncClient | None = None,
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
        self._http = http_client or httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: Call) -> Any:
        attempt = 0
        while True:
            request = self._build(self._http, call)
            try:
                resp = await self._http.send(request)
            except httpx.TransportError as exc:
                await asyncio.sleep(self._transport_outcome(call, exc, attempt))
                attempt += 1
                continue
            result, delay, _ = self._outcome(call, resp, attempt)
            if delay is None:
                return result
            await asyncio.sleep(delay)
            attempt += 1

    # ---- store ---------------------------------------------------------------------------------

    async def store_turns(
        self,
        conversation_id: str,
        turns: Sequence[TurnLike],
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> StoreResponse:
        """``POST /v1/conversations/{id}/turns``; see :meth:`Client.store_turns`."""
        return await self._send(self._store_turns_call(conversation_id, turns, wait, timeout))

    async def store_turn(
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
        return (await self.store_turns(conversation_id, [turn], wait=wait, timeout=timeout)).memory_ids[0]

    async def store_turns_batched(
        self,
        conversation_id: str,
        turns: Iterable[TurnLike],
        *,
        batch_size: int = 500,
        wait: bool = False,
        timeout: float | None = None,
    ) -> list[str]:
        """Store any number of turns in sequential requests of ``batch_size``; see
        :meth:`Client.store_turns_batched`."""
        ids: list[str] = []
        for batch in chunks(turns, batch_size):
            ids.extend((await self.store_turns(conversation_id, batch, wait=wait, timeout=timeout)).memory_ids)
        return ids

    # ---- query ---------------------------------------------------------------------------------

    async def recall(
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
        """``POST /v1/recall`` with the same filters and ``as_of``; see :meth:`Client.recall`."""
        return await self._send(
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

    async def get_memory(
        self, memory_id: str, *, as_of: datetime | str | None = None, timeout: float | None = None
    ) -> TurnView:
        """``GET /v1/memories/{id}``: one stored turn with its extraction (with ``as_of``: the
        version held then); see :meth:`Client.get_memory`."""
        return await self._send(self._get_memory_call(memory_id, timeout, as_of))

    async def edit_memory(
        self,
        memory_id: str,
        *,
        user: str | None = None,
        assistant: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> Turn:
        """``PATCH /v1/memories/{id}``: a new version; see :meth:`Client.edit_memory`."""
        return await self._send(self._edit_memory_call(memory_id, user, assistant, metadata, wait, timeout))

    async def memory_history(self, memory_id: str, *, timeout: float | None = None) -> MemoryHistory:
        """``GET /v1/memories/{id}/history``: every version, oldest first."""
        return await self._send(self._memory_history_call(memory_id, timeout))

    async def reindex(self, *, timeout: float | None = None) -> Reindexing:
        """``POST /v1/reindex``: every turn of the tenant derived again; see :meth:`Client.reindex`."""
        return await self._send(self._reindex_call(timeout))

    async def get_memories(
        self, memory_ids: Iterable[str], *, concurrency: int = 8, timeout: float | None = None
    ) -> list[TurnView]:
        """Several stored turns, in the order given, fetched ``concurrency`` at a time (keep it
        under the server's ``max_in_flight``); a missing one raises
        :class:`~recollect_client.errors.NotFoundError`."""
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(memory_id: str) -> TurnView:
            async with gate:
                return await self.get_memory(memory_id, timeout=timeout)

        return list(await asyncio.gather(*(one(m) for m in memory_ids)))

    async def conversation_info(self, conversation_id: str, *, timeout: float | None = None) -> ConversationInfo:
        """``GET /v1/conversations/{id}``: stored, pending and recallable turn counts."""
        return await self._send(self._conversation_info_call(conversation_id, timeout))

    # ---- listings (cursor-paged) ---------------------------------------------------------------

    async def list_conversations(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        timeout: float | None = None,
    ) -> ConversationPage:
        """``GET /v1/conversations``: one page of conversation ids; see :meth:`Client.list_conversations`."""
        return await self._send(self._list_conversations_call(limit, cursor, timeout, user_id, agent_id))

    def iter_conversations(
        self,
        *,
        page_size: int | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[str]:
        """Every conversation id of the tenant (or of one end user/agent), page after page:
        ``async for c in rc.iter_conversations()``."""

        async def fetch(cursor: str | None) -> Page[str]:
            page = await self.list_conversations(
                limit=page_size, cursor=cursor, user_id=user_id, agent_id=agent_id, timeout=timeout
            )
            return Page(page.conversations, page.next_cursor)

        return aiter_items(fetch)

    async def list_turns(
        self,
        conversation_id: str,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        timeout: float | None = None,
    ) -> TurnPage:
        """``GET /v1/conversations/{id}/turns``: one page of turns; see :meth:`Client.list_turns`."""
        return await self._send(self._list_turns_call(conversation_id, limit, cursor, timeout))

    def iter_turns(
        self, conversation_id: str, *, page_size: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[TurnView]:
        """Every turn of a conversation in order: ``async for t in rc.iter_turns(id)``."""

        async def fetch(cursor: str | None) -> Page[TurnView]:
            page = await self.list_turns(conversation_id, limit=page_size, cursor=cursor, timeout=timeout)
            return Page(page.turns, page.next_cursor)

        return aiter_items(fetch)

    # ---- erase ---------------------------------------------------------------------------------

    async def delete_conversation(self, conversation_id: str, *, timeout: float | None = None) -> Erased:
        """``DELETE /v1/conversations/{id}``: erase the conversation from every store."""
        return await self._send(self._delete_conversation_call(conversation_id, timeout))

    async def delete_memory(self, memory_id: str, *, timeout: float | None = None) -> MemoryErased:
        """``DELETE /v1/memories/{id}``: erase one turn from every store; see :meth:`Client.delete_memory`."""
        return await self._send(self._delete_memory_call(memory_id, timeout))

    async def erase_tenant(self, confirm: str, *, timeout: float | None = None) -> TenantErased:
        """``DELETE /v1/tenant?confirm=TENANT``: erase every conversation of the caller's tenant."""
        return await self._send(self._erase_tenant_call(confirm, timeout))

    # ---- operations ----------------------------------------------------------------------------

    async def healthz(self, *, timeout: float | None = None) -> str:
        return await self._send(self._healthz_call(timeout))

    async def readyz(self, *, timeout: float | None = None) -> str:
        return await self._send(self._readyz_call(timeout))

    async def is_ready(self, *, timeout: float | None = None) -> bool:
        try:
            await self.readyz(timeout=timeout)
            return True
        except (errors.APIError, errors.TransportError):
            return False

    async def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.1) -> None:
        deadline = time.monotonic() + timeout
        while not await self.is_ready(timeout=min(5.0, timeout)):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.base_url} not ready within {timeout}s")
            await asyncio.sleep(interval)

    async def metrics(self, *, timeout: float | None = None) -> str:
        return await self._send(self._metrics_call(timeout))

    async def openapi(self, *, timeout: float | None = None) -> dict:
        return await self._send(self._openapi_call(timeout))

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        idempotent: bool | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """Any request, with this client's auth, retries and typed errors; see :meth:`Client.request`."""
        return await self._send(self._raw_call(method, path, json, params, idempotent, timeout))
