"""LangChain integration (``pip install "recollect-memory-client[langchain]"``).

* :class:`RecollectChatMessageHistory`: a ``BaseChatMessageHistory`` whose messages live in one
  Recollect conversation (for ``RunnableWithMessageHistory`` and anything else that takes a
  chat history).
* :class:`RecollectRetriever`: a ``BaseRetriever`` over recall: the memories best matching a query,
  across conversations, as ``Document``s carrying score, sources and score parts.

Example::

    from langchain_core.runnables.history import RunnableWithMessageHistory
    from recollect_client import Client
    from recollect_client.integrations.langchain import RecollectChatMessageHistory

    rc = Client("http://127.0.0.1:8080", api_key="KEY")
    chain_with_memory = RunnableWithMessageHistory(
        chain, lambda session_id: RecollectChatMessageHistory(session_id, rc),
        input_messages_key="question", history_messages_key="history",
    )
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.documents import Document
    from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage
    from langchain_core.retrievers import BaseRetriever
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "recollect_client.integrations.langchain needs langchain-core: "
        'pip install "recollect-memory-client[langchain]"'
    ) from e

from ..async_client import AsyncClient
from ..client import Client
from ..errors import NotFoundError
from ..models import RecalledMemory, Turn
from . import _turns

_ROLE_OF_TYPE = {"human": _turns.USER, "ai": _turns.ASSISTANT, "system": "system"}


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
    return "".join(parts)


def _to_message(m: _turns.Message) -> BaseMessage:
    name = {"name": m.name} if m.name else {}
    if m.role == _turns.USER:
        return HumanMessage(content=m.text, **name)
    if m.role == _turns.ASSISTANT:
        return AIMessage(content=m.text, **name)
    if m.role == "system":
        return SystemMessage(content=m.text, **name)
    return ChatMessage(role=m.role, content=m.text, **name)


def _from_message(message: BaseMessage) -> _turns.Message:
    role = _ROLE_OF_TYPE.get(message.type)
    if role is None:
        role = getattr(message, "role", None) or message.type
    return _turns.Message(role, _text(message), message.name)


def turns_to_messages(turns: Sequence[Turn]) -> list[BaseMessage]:
    """Stored turns as LangChain messages, in the order given."""
    return [_to_message(m) for t in turns for m in _turns.from_turn(t)]


class RecollectChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history kept in the Recollect conversation ``conversation_id``.

    ``add_messages`` stores the messages as turns (a human message and the AI reply after it form
    one turn; other messages a turn each; roles kept in the turn's metadata) and, with
    ``wait=True`` (the default), answers once they are recallable. ``messages`` reads the
    conversation back from the server in order (``GET /v1/conversations/{id}/turns``, page by
    page), so a new object for the same conversation (as ``RunnableWithMessageHistory``'s session
    factory makes) sees everything stored before, by this process or any other. ``clear`` erases
    the conversation from every store. :meth:`search` recalls the turns of this conversation that
    best match a query.

    With ``user_id`` every stored turn carries that end user (so a
    :class:`RecollectRetriever` or ``Client.recall(user_ids=[...])`` scoped to the user finds it,
    and ``Client.list_conversations(user_id=...)`` lists the conversation).

    Args:
        conversation_id: the conversation (1–128 of letters, digits, ``_ - . : @``).
        client: a :class:`~recollect_client.Client` (sync methods).
        async_client: an :class:`~recollect_client.AsyncClient` for the async methods; without
            it they run the sync ones in a thread.
        wait: store with ``wait`` (answer once recallable).
        user_speaker, assistant_speaker: speaker names for messages that carry no ``name``.
        page_size: turns per listing request when reading ``messages`` (1..500).
        user_id: the end user the conversation belongs to, stamped on every stored turn.
    """

    def __init__(
        self,
        conversation_id: str,
        client: Client | None = None,
        *,
        async_client: AsyncClient | None = None,
        wait: bool = True,
        user_speaker: str | None = None,
        assistant_speaker: str | None = None,
        page_size: int = 200,
        user_id: str | None = None,
    ) -> None:
        super().__init__()
        if client is None and async_client is None:
            raise ValueError("RecollectChatMessageHistory needs a Client or an AsyncClient")
        self.conversation_id = conversation_id
        self.client = client
        self.async_client = async_client
        self.wait = wait
        self.user_speaker = user_speaker
        self.assistant_speaker = assistant_speaker
        self.page_size = page_size
        self.user_id = user_id

    def _turn_inputs(self, messages: Sequence[BaseMessage]):
        return _turns.to_turns(
            (_from_message(m) for m in messages),
            source="langchain",
            user_speaker=self.user_speaker,
            assistant_speaker=self.assistant_speaker,
            user_id=self.user_id,
        )

    def _sync(self) -> Client:
        if self.client is None:
            raise RuntimeError("this history was made with an AsyncClient only: use the async methods")
        return self.client

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return turns_to_messages(_turns.read_turns(self._sync(), self.conversation_id, self.page_size))

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        turns = self._turn_inputs(messages)
        if turns:
            self._sync().store_turns(self.conversation_id, turns, wait=self.wait)

    def clear(self) -> None:
        try:
            self._sync().delete_conversation(self.conversation_id)
        except NotFoundError:
            pass

    def search(self, query: str, k: int = 5) -> list[RecalledMemory]:
        """The turns of this conversation best matching ``query``, best first."""
        try:
            return self._sync().recall(query, conversation_ids=[self.conversation_id], k=k).memories
        except NotFoundError:
            return []

    async def aget_messages(self) -> list[BaseMessage]:
        if self.async_client is None:
            return await super().aget_messages()
        turns = await _turns.aread_turns(self.async_client, self.conversation_id, self.page_size)
        return turns_to_messages(turns)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self.async_client is None:
            return await super().aadd_messages(messages)
        turns = self._turn_inputs(messages)
        if turns:
            await self.async_client.store_turns(self.conversation_id, turns, wait=self.wait)

    async def aclear(self) -> None:
        if self.async_client is None:
            return await super().aclear()
        try:
            await self.async_client.delete_conversation(self.conversation_id)
        except NotFoundError:
            pass

    async def asearch(self, query: str, k: int = 5) -> list[RecalledMemory]:
        if self.async_client is None:
            raise RuntimeError("asearch needs an AsyncClient")
        try:
            return (await self.async_client.recall(query, conversation_ids=[self.conversation_id], k=k)).memories
        except NotFoundError:
            return []


def memory_to_document(m: RecalledMemory) -> Document:
    """A recalled memory as a LangChain ``Document``: the turn's text (speakers and time) as
    ``page_content``, everything else in ``metadata``."""
    return Document(
        page_content=_turns.format_memory(m),
        metadata={
            "memory_id": m.memory_id,
            "conversation_id": m.conversation_id,
            "turn_id": m.turn_id,
            "timestamp": m.timestamp.isoformat(),
            "score": m.score,
            "sources": list(m.sources),
            "score_parts": m.score_parts.model_dump(),
            "user": m.user,
            "assistant": m.assistant,
            "user_speaker": m.user_speaker,
            "assistant_speaker": m.assistant_speaker,
            "user_id": m.user_id,
            "agent_id": m.agent_id,
        },
        id=m.memory_id,
    )


class RecollectRetriever(BaseRetriever):
    """A LangChain retriever over Recollect's recall.

    Args:
        client / async_client: the clients to use (at least one; the async path uses
            ``async_client`` when given, else runs the sync one in a thread).
        conversation_ids: narrow recall to these conversations (default: every conversation of
            the API key's tenant).
        user_id: narrow recall to the turns of this end user, in any of their conversations.
        k: how many memories (1..1000).

    Example::

        retriever = RecollectRetriever(client=rc, conversation_ids=["chat-1"], k=5)
        docs = retriever.invoke("What did Melanie paint?")
        mine = RecollectRetriever(client=rc, user_id="cust-42").invoke("my order")
    """

    client: Any = None
    async_client: Any = None
    conversation_ids: list[str] | None = None
    user_id: str | None = None
    k: int = 10

    def model_post_init(self, __context: Any) -> None:
        if self.client is None and self.async_client is None:
            raise ValueError("RecollectRetriever needs client= or async_client=")

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        if self.client is None:
            raise RuntimeError("this retriever was made with an AsyncClient only: use ainvoke")
        try:
            hits = self.client.recall(
                query, conversation_ids=self.conversation_ids, user_ids=_turns.user_scope(self.user_id), k=self.k
            )
        except NotFoundError:  # a named conversation does not exist (yet)
            return []
        return [memory_to_document(m) for m in hits.memories]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager)
        try:
            hits = await self.async_client.recall(
                query, conversation_ids=self.conversation_ids, user_ids=_turns.user_scope(self.user_id), k=self.k
            )
        except NotFoundError:
            return []
        return [memory_to_document(m) for m in hits.memories]


__all__ = ["RecollectChatMessageHistory", "RecollectRetriever", "memory_to_document", "turns_to_messages"]
