"""The LlamaIndex memory block against the live server, alone and inside llama-index-core's
``Memory`` (whose short-term buffer flushes old messages into the block)."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ChatMessage, MessageRole  # noqa: E402
from llama_index.core.memory import Memory  # noqa: E402

from recollect_client import AsyncClient  # noqa: E402
from recollect_client.integrations.llama_index import RecollectMemoryBlock  # noqa: E402

pytestmark = pytest.mark.anyio


def words(text: str) -> list[str]:
    """A tokenizer for Memory's token counting that needs no download (tiktoken fetches its files)."""
    return text.split()


@pytest.fixture
async def aclient(url):
    async with AsyncClient(url, "py-key") as c:
        yield c


async def test_block_put_then_get(aclient, conv):
    block = RecollectMemoryBlock(client=aclient, conversation_id=conv, k=2)
    await block.aput(
        [
            ChatMessage(role=MessageRole.USER, content="I painted a sunrise over the lake last week."),
            ChatMessage(role=MessageRole.ASSISTANT, content="Lovely, painting by the lake must be calming."),
            ChatMessage(role=MessageRole.USER, content="We adopted a puppy named Biscuit."),
            ChatMessage(role=MessageRole.ASSISTANT, content="What a sweet name."),
        ]
    )
    info = await aclient.conversation_info(conv)
    assert (info.turns, info.recallable) == (2, 2)
    content = await block.aget([ChatMessage(role=MessageRole.USER, content="What is the puppy called?")])
    first = content.split("\n\n")[0]
    assert "user: We adopted a puppy named Biscuit." in first and "assistant: What a sweet name." in first
    assert "sunrise" in content  # k=2: both turns, best first


async def test_block_with_nothing_stored_or_no_query(aclient, conv):
    block = RecollectMemoryBlock(client=aclient, conversation_id=conv)
    assert await block.aget([ChatMessage(role=MessageRole.USER, content="anything?")]) == ""
    assert await block.aget([]) == ""
    with pytest.raises(ValueError):
        await RecollectMemoryBlock(client=aclient).aput([ChatMessage(role=MessageRole.USER, content="x")])


async def test_memory_flushes_into_recollect_and_recalls_from_it(aclient, conv):
    block = RecollectMemoryBlock(client=aclient, k=3)
    memory = Memory.from_defaults(
        session_id=conv,
        token_limit=60,
        chat_history_token_ratio=0.5,
        token_flush_size=20,
        tokenizer_fn=words,
        memory_blocks=[block],
    )
    facts = [
        ("My sister Ana lives in Lisbon and teaches chemistry.", "Nice, chemistry is a great subject."),
        ("I adopted a grey cat named Pixel last spring.", "Pixel is a fun name for a cat."),
        ("I am training for the Porto marathon in October.", "Good luck with the training."),
        ("My favourite dish is bacalhau with chickpeas.", "That sounds delicious."),
    ]
    for user, assistant in facts:
        await memory.aput(ChatMessage(role=MessageRole.USER, content=user))
        await memory.aput(ChatMessage(role=MessageRole.ASSISTANT, content=assistant))

    # The oldest exchanges left the short-term buffer and were stored as turns of the session.
    info = await aclient.conversation_info(conv)
    assert info.turns >= 1 and info.recallable == info.turns
    first = await aclient.recall("Ana Lisbon chemistry", conversation_ids=[conv], k=1)
    assert first.memories[0].user == facts[0][0] and first.memories[0].assistant == facts[0][1]

    messages = await memory.aget(input="What does my sister teach?")
    system = messages[0]
    assert system.role == MessageRole.SYSTEM
    assert "<RecollectMemory>" in system.content
    assert "My sister Ana lives in Lisbon and teaches chemistry." in system.content
    # the recent exchange stays in the chat history itself
    assert any("bacalhau" in (m.content or "") for m in messages[1:])


async def test_tenant_scope_recalls_other_sessions(aclient, conv):
    other = conv + "-old"
    try:
        await aclient.store_turn(other, "I work as a lighthouse keeper in Maine.", wait=True)
        narrow = RecollectMemoryBlock(client=aclient, conversation_id=conv, k=5)
        wide = RecollectMemoryBlock(client=aclient, conversation_id=conv, scope="tenant", k=50)
        query = [ChatMessage(role=MessageRole.USER, content="What is my job at the lighthouse?")]
        assert "lighthouse keeper" not in await narrow.aget(query)
        assert "lighthouse keeper" in await wide.aget(query)
    finally:
        await aclient.delete_conversation(other)


async def test_user_scope_keeps_to_one_end_user(aclient, conv):
    tag = uuid.uuid4().hex[:8]
    mine, theirs = f"{conv}-old", f"{conv}-theirs"
    try:
        await aclient.store_turn(mine, "I work as a lighthouse keeper in Maine.", user_id=f"u-{tag}-a", wait=True)
        await aclient.store_turn(theirs, "I work as a lighthouse painter in Oregon.", user_id=f"u-{tag}-b", wait=True)
        block = RecollectMemoryBlock(client=aclient, conversation_id=conv, scope="tenant", user_id=f"u-{tag}-a", k=50)
        content = await block.aget([ChatMessage(role=MessageRole.USER, content="What is my job at the lighthouse?")])
        assert "lighthouse keeper" in content and "Oregon" not in content
        # what the block stores carries the user too
        await block.aput([ChatMessage(role=MessageRole.USER, content="I also keep bees.")])
        convs = [c async for c in aclient.iter_conversations(user_id=f"u-{tag}-a")]
        assert sorted(convs) == sorted([conv, mine])
    finally:
        await aclient.delete_conversation(mine)
        await aclient.delete_conversation(theirs)


async def test_min_score_and_truncation(aclient, conv):
    block = RecollectMemoryBlock(client=aclient, conversation_id=conv, k=5)
    await block.aput(
        [ChatMessage(role=MessageRole.USER, content=f"Fact number {i}: the {w} is blue.") for i, w in
         enumerate(["sky", "sea", "car", "door"])]
    )
    content = await block.aget([ChatMessage(role=MessageRole.USER, content="what is blue?")])
    entries = content.split("\n\n")
    assert len(entries) == 4
    shorter = await block.atruncate(content, tokens_to_truncate=len(entries[-1]) // 4)
    assert shorter == "\n\n".join(entries[:-1])
    assert await block.atruncate(content, tokens_to_truncate=10_000) is None
    strict = RecollectMemoryBlock(client=aclient, conversation_id=conv, k=5, min_score=10.0)
    assert await strict.aget([ChatMessage(role=MessageRole.USER, content="what is blue?")]) == ""


async def test_sync_client_runs_in_a_thread(client, conv):
    block = RecollectMemoryBlock(client=client, conversation_id=conv)
    await block.aput([ChatMessage(role="user", content="Sync clients work too."),
                      ChatMessage(role="assistant", content="Good.")])
    assert "Sync clients work too." in await block.aget([ChatMessage(role="user", content="do sync clients work?")])
