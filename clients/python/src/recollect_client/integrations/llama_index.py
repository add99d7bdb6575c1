"""LlamaIndex integration (``pip install "recollect-memory-client[llamaindex]"``): a memory block
for llama-index-core's ``Memory`` backed by Recollect.

Messages that leave the short-term chat buffer (``Memory`` flushes them to its blocks when the
token limit is reached) are stored as Recollect turns; on every ``Memory.get``/``aget`` the block
recalls the turns best matching the latest messages and hands them to the prompt.

Example::

    from llama_index.core.memory import Memory
    from recollect_client import AsyncClient
    from recollect_client.integrations.llama_index import RecollectMemoryBlock

    memory = Memory.from_defaults(
        session_id="chat-1",
        token_limit=4000,
        memory_blocks=[RecollectMemoryBlock(client=AsyncClient("http://127.0.0.1:8080", api_key="KEY"), k=5)],
    )
    agent.run("What did I paint last week?", memory=memory)
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

try:
    from llama_index.core.base.llms.types import ChatMessage, MessageRole
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.memory.memory import BaseMemoryBlock
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "recollect_client.integrations.llama_index needs llama-index-core: "
        'pip install "recollect-memory-client[llamaindex]"'
    ) from e

from ..async_client import AsyncClient
from ..errors import NotFoundError
from ..models import RecalledMemory
from . import _turns

# The server refuses longer queries (server.max_query_bytes, 4096 by default).
MAX_QUERY_BYTES = 4096
_ASSISTANT_ROLES = {MessageRole.ASSISTANT.value, MessageRole.CHATBOT.value, MessageRole.MODEL.value}


def _role(message: ChatMessage) -> str:
    role = message.role.value if isinstance(message.role, MessageRole) else str(message.role)
    if role == MessageRole.USER.value:
        return _turns.USER
    if role in _ASSISTANT_ROLES:
        return _turns.ASSISTANT
    return role


def _text(message: ChatMessage) -> str:
    return message.content or ""


def _query(messages: list[ChatMessage], window: int) -> str:
    """The text of the last ``window`` messages that have text, newest kept when over the limit."""
    texts = [_text(m).strip() for m in messages]
    texts = [t for t in texts if t][-window:]
    query = "\n".join(texts)
    data = query.encode("utf-8")
    if len(data) > MAX_QUERY_BYTES:
        query = data[-MAX_QUERY_BYTES:].decode("utf-8", errors="ignore").strip()
    return query


class RecollectMemoryBlock(BaseMemoryBlock[str]):
    """Long-term memory for llama-index ``Memory``, kept in Recollect.

    Attributes:
        client: an :class:`~recollect_client.AsyncClient` (or a sync ``Client``, run in a thread).
        conversation_id: where flushed messages are stored and what is recalled from; default:
            the ``Memory``'s ``session_id``.
        scope: ``"conversation"`` recalls from that conversation only, ``"tenant"`` from every
            conversation of the API key's tenant (what the user said in other sessions too).
        user_id: the end user: stamped on the stored turns, and recall keeps to their turns (with
            ``scope="tenant"``: across every conversation of that user, and no one else's).
        k: memories per recall.
        query_messages: how many of the latest messages form the recall query.
        min_score: leave out memories scoring below this.
        wait: store with ``wait`` (recallable as soon as the store answers).
    """

    name: str = Field(default="RecollectMemory", description="The name of the memory block.")
    description: str | None = Field(
        default="Earlier conversation turns recalled from Recollect long-term memory, best match first.",
    )
    client: Any = Field(description="recollect_client.AsyncClient (or Client)")
    conversation_id: str | None = Field(default=None)
    scope: Literal["conversation", "tenant"] = Field(default="conversation")
    k: int = Field(default=5, ge=1, le=1000)
    query_messages: int = Field(default=3, ge=1)
    min_score: float | None = Field(default=None)
    wait: bool = Field(default=True)
    user_speaker: str | None = Field(default=None)
    assistant_speaker: str | None = Field(default=None)
    user_id: str | None = Field(default=None)

    _last: list[str] = PrivateAttr(default_factory=list)
    _last_session: str | None = PrivateAttr(default=None)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.client, method)
        if isinstance(self.client, AsyncClient):
            return await fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    def _conversation(self, session_id: str | None) -> str | None:
        return self.conversation_id or session_id or self._last_session

    async def recall(self, query: str, session_id: str | None = None) -> list[RecalledMemory]:
        """The memories this block would hand to the prompt for ``query``."""
        conversation = self._conversation(session_id)
        ids = [conversation] if self.scope == "conversation" and conversation else None
        try:
            hits = await self._call(
                "recall", query, conversation_ids=ids, user_ids=_turns.user_scope(self.user_id), k=self.k
            )
        except NotFoundError:  # nothing stored in this conversation yet
            return []
        return [m for m in hits.memories if self.min_score is None or m.score >= self.min_score]

    async def _aget(
        self, messages: list[ChatMessage] | None = None, session_id: str | None = None, **block_kwargs: Any
    ) -> str:
        query = _query(messages or [], self.query_messages)
        if not query:
            return ""
        entries = [_turns.format_memory(m) for m in await self.recall(query, session_id)]
        self._last = entries
        return "\n\n".join(entries)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        session_id = None
        for m in messages:
            # Memory.aput tags each message with its session; it is not part of the message.
            session_id = m.additional_kwargs.pop("session_id", None) or session_id
        if session_id:
            self._last_session = session_id
        conversation = self._conversation(session_id)
        if conversation is None:
            raise ValueError("RecollectMemoryBlock needs conversation_id= or a Memory session_id")
        turns = _turns.to_turns(
            (_turns.Message(_role(m), _text(m)) for m in messages),
            source="llama-index",
            user_speaker=self.user_speaker,
            assistant_speaker=self.assistant_speaker,
            user_id=self.user_id,
        )
        if turns:
            await self._call("store_turns", conversation, turns, wait=self.wait)

    async def atruncate(self, content: str, tokens_to_truncate: int) -> str | None:
        """Drop the lowest-ranked memories until about ``tokens_to_truncate`` tokens (~4
        characters each) are gone; ``None`` when nothing is left."""
        entries = list(self._last) if "\n\n".join(self._last) == content else [content]
        to_drop = tokens_to_truncate * 4
        while entries and to_drop > 0:
            to_drop -= len(entries.pop()) + 2
        return "\n\n".join(entries) or None


__all__ = ["RecollectMemoryBlock"]
