"""Chat messages ↔ Recollect turns, shared by the LangChain and LlamaIndex integrations.

A turn holds a user text and optionally the assistant's reply. A user message and the assistant
message(s) right after it become one turn; any other message (an assistant message with no user
message before it, a system or tool message) becomes a turn of its own with the text in ``user``.
Each turn records the roles in ``metadata["recollect_client"]`` so it reads back as the same
messages, and carries the end user's ``user_id`` when the integration was given one. Messages without text (e.g. an assistant message that only calls tools) are skipped:
the server refuses empty turns.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._base import utc_now
from ..errors import NotFoundError
from ..models import Turn, TurnInput

META_KEY = "recollect_client"
USER = "user"
ASSISTANT = "assistant"


@dataclass
class Message:
    """A chat message reduced to what a turn keeps. ``role`` is ``user``, ``assistant`` or any
    other role name (``system``, ``tool``, ...)."""

    role: str
    text: str
    name: str | None = None


@dataclass
class _Open:
    role: str
    text: str
    name: str | None
    replies: list[str] = field(default_factory=list)
    reply_name: str | None = None


def to_turns(
    messages: Iterable[Message],
    *,
    source: str,
    user_speaker: str | None = None,
    assistant_speaker: str | None = None,
    turn_id_prefix: str = "",
    user_id: str | None = None,
) -> list[TurnInput]:
    """Pair the messages into turns (see the module doc). Every turn gets a fresh ``turn_id`` so
    that a retried store is idempotent, and ``user_id`` (the end user recall can be scoped to)."""
    now = utc_now()
    turns: list[TurnInput] = []
    current: _Open | None = None

    def close() -> None:
        nonlocal current
        if current is None:
            return
        meta: dict[str, Any] = {"source": source, "user_role": current.role}
        reply = "\n\n".join(current.replies) if current.replies else None
        if reply is not None:
            meta["assistant_role"] = ASSISTANT
        default_speaker = user_speaker if current.role == USER else assistant_speaker if current.role == ASSISTANT else None
        turns.append(
            TurnInput(
                turn_id=f"{turn_id_prefix}{uuid.uuid4().hex}",
                user=current.text,
                assistant=reply,
                user_speaker=current.name or default_speaker,
                assistant_speaker=(current.reply_name or assistant_speaker) if reply is not None else None,
                timestamp=now,
                metadata={META_KEY: meta},
                user_id=user_id,
            )
        )
        current = None

    for m in messages:
        if not m.text or not m.text.strip():
            continue
        if m.role == ASSISTANT and current is not None and current.role == USER:
            current.replies.append(m.text)
            current.reply_name = current.reply_name or m.name
            continue
        close()
        current = _Open(m.role, m.text, m.name)
        if m.role != USER:
            close()
    close()
    return turns


def from_turn(turn: Turn) -> list[Message]:
    """The messages a stored turn stands for (roles from its metadata; a turn stored by other
    means reads as a user message and, when it has one, the assistant's reply)."""
    meta = (turn.metadata or {}).get(META_KEY) or {}
    role = meta.get("user_role", USER) if isinstance(meta, dict) else USER
    out = [Message(str(role), turn.user, turn.user_speaker)]
    if turn.assistant:
        out.append(Message(ASSISTANT, turn.assistant, turn.assistant_speaker))
    return out


def read_turns(client: Any, conversation_id: str, page_size: int) -> list[Turn]:
    """Every turn of a conversation, in order, through the paged listing (sync ``Client``);
    an unknown conversation reads as empty."""
    try:
        return list(client.iter_turns(conversation_id, page_size=page_size))
    except NotFoundError:
        return []


async def aread_turns(client: Any, conversation_id: str, page_size: int) -> list[Turn]:
    """:func:`read_turns` with an ``AsyncClient``."""
    try:
        return [t async for t in client.iter_turns(conversation_id, page_size=page_size)]
    except NotFoundError:
        return []


def user_scope(user_id: str | None) -> list[str] | None:
    """The ``user_ids`` filter of a recall scoped to ``user_id`` (``None``: not scoped)."""
    return [user_id] if user_id is not None else None


def format_memory(m: Any) -> str:
    """One recalled memory as prompt text: ``[timestamp] speaker: text`` lines."""
    when = m.timestamp.isoformat() if hasattr(m.timestamp, "isoformat") else str(m.timestamp)
    lines = [f"[{when}] {m.user_speaker or 'user'}: {m.user}"]
    if m.assistant:
        lines.append(f"{m.assistant_speaker or 'assistant'}: {m.assistant}")
    return "\n".join(lines)
