"""The LangChain integration against the live server: the chat history (also inside
RunnableWithMessageHistory, with a fresh history object per call as LangChain makes them) and
the retriever."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("langchain_core")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402
from langchain_core.runnables.history import RunnableWithMessageHistory  # noqa: E402

from recollect_client import AsyncClient, Client  # noqa: E402
from recollect_client.integrations.langchain import (  # noqa: E402
    RecollectChatMessageHistory,
    RecollectRetriever,
)


def plain(messages):
    return [(type(m).__name__, m.content, m.name) for m in messages]


def test_history_round_trips_through_the_server(client, conv):
    h = RecollectChatMessageHistory(conv, client)
    assert h.messages == []
    h.add_messages([HumanMessage("I painted a sunrise over the lake."), AIMessage("Lovely! Was it calm?")])
    h.add_user_message("It was. Next I'll paint the harbour.")
    h.add_messages([SystemMessage("Be brief."), AIMessage("Noted.", name="Bot")])

    # A new object for the same conversation reads everything back from the server, in order
    # (two turns per listing request here: the history walks the pages).
    fresh = RecollectChatMessageHistory(conv, client, page_size=2)
    assert plain(fresh.messages) == [
        ("HumanMessage", "I painted a sunrise over the lake.", None),
        ("AIMessage", "Lovely! Was it calm?", None),
        ("HumanMessage", "It was. Next I'll paint the harbour.", None),
        ("SystemMessage", "Be brief.", None),
        ("AIMessage", "Noted.", "Bot"),
    ]
    # A human message and the AI reply right after it are one turn.
    info = client.conversation_info(conv)
    assert info.turns == 4 and info.recallable == 4
    first = client.recall("sunrise over the lake", conversation_ids=[conv], k=1).memories[0]
    assert (first.user, first.assistant) == ("I painted a sunrise over the lake.", "Lovely! Was it calm?")


def test_history_keeps_names_other_roles_and_skips_empty_messages(client, conv):
    h = RecollectChatMessageHistory(conv, client, user_speaker="Caroline")
    h.add_messages(
        [
            HumanMessage("Where is my order?", name="Mel"),
            AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": "call-1"}]),
            ToolMessage("order 17 shipped", tool_call_id="call-1"),
            AIMessage([{"type": "text", "text": "It shipped "}, {"type": "text", "text": "today."}]),
            ChatMessage(role="critic", content="Good answer."),
            HumanMessage("Thanks"),
        ]
    )
    assert plain(RecollectChatMessageHistory(conv, client).messages) == [
        ("HumanMessage", "Where is my order?", "Mel"),
        ("ChatMessage", "order 17 shipped", None),
        ("AIMessage", "It shipped today.", None),
        ("ChatMessage", "Good answer.", None),
        ("HumanMessage", "Thanks", "Caroline"),
    ]


def test_clear_erases_the_conversation(client, conv):
    h = RecollectChatMessageHistory(conv, client)
    h.add_messages([HumanMessage("remember the code 4711"), AIMessage("I will.")])
    assert len(h.messages) == 2
    h.clear()
    assert h.messages == []
    assert RecollectChatMessageHistory(conv, client).messages == []
    h.clear()  # clearing an empty history is fine


def test_search_recalls_within_the_conversation(client, conv):
    h = RecollectChatMessageHistory(conv, client)
    h.add_messages([HumanMessage("Our dog is called Biscuit."), AIMessage("Cute name!")])
    h.add_messages([HumanMessage("We live in Porto."), AIMessage("Beautiful city.")])
    hits = h.search("what is the dog called?", k=1)
    assert hits[0].user == "Our dog is called Biscuit."
    assert RecollectChatMessageHistory(conv + "-none", client).search("dog") == []


# langchain-core 1.x marks RunnableWithMessageHistory deprecated (LangGraph persistence replaces it);
# it remains the stock consumer of BaseChatMessageHistory.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_runnable_with_message_history(client, conv):
    seen_prompts = []

    def fake_model(prompt_value):
        messages = prompt_value.to_messages()
        seen_prompts.append(messages)
        return AIMessage(f"reply {len(seen_prompts)}: I saw {len(messages)} messages")

    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are helpful."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | RunnableLambda(fake_model),
        lambda session_id: RecollectChatMessageHistory(session_id, client),
        input_messages_key="question",
        history_messages_key="history",
    )
    cfg = {"configurable": {"session_id": conv}}
    assert chain.invoke({"question": "My favourite colour is teal."}, config=cfg).content == "reply 1: I saw 2 messages"
    assert chain.invoke({"question": "What is my favourite colour?"}, config=cfg).content == "reply 2: I saw 4 messages"
    # The second prompt carried the first exchange, read back from Recollect.
    assert [m.content for m in seen_prompts[1][1:3]] == ["My favourite colour is teal.", "reply 1: I saw 2 messages"]
    hits = client.recall("favourite colour", conversation_ids=[conv], k=5).memories
    assert {(m.user, m.assistant) for m in hits} == {
        ("My favourite colour is teal.", "reply 1: I saw 2 messages"),
        ("What is my favourite colour?", "reply 2: I saw 4 messages"),
    }


@pytest.mark.anyio
async def test_async_history(url, conv):
    async with AsyncClient(url, "py-key") as ac:
        h = RecollectChatMessageHistory(conv, async_client=ac)
        await h.aadd_messages([HumanMessage("async hello"), AIMessage("async hi")])
        assert plain(await h.aget_messages()) == [
            ("HumanMessage", "async hello", None),
            ("AIMessage", "async hi", None),
        ]
        assert (await h.asearch("hello"))[0].user == "async hello"
        await h.aclear()
        assert await h.aget_messages() == []
        with pytest.raises(RuntimeError):
            h.messages  # noqa: B018 - sync access without a sync client


@pytest.mark.anyio
async def test_async_methods_fall_back_to_the_sync_client(client, conv):
    h = RecollectChatMessageHistory(conv, client)
    await h.aadd_messages([HumanMessage("via a thread")])
    assert plain(await h.aget_messages()) == [("HumanMessage", "via a thread", None)]


def test_retriever(client, conv):
    client.store_turns(
        conv,
        [
            {"user": "I painted a sunrise over the lake last week.", "user_speaker": "Melanie",
             "timestamp": "2023-05-08T14:01:00Z"},
            {"user": "We adopted a puppy named Biscuit.", "timestamp": "2023-05-09T10:00:00Z"},
        ],
        wait=True,
    )
    retriever = RecollectRetriever(client=client, conversation_ids=[conv], k=2)
    docs = retriever.invoke("What did Melanie paint?")
    assert len(docs) == 2 and all(isinstance(d, Document) for d in docs)
    top = docs[0]
    assert "Melanie: I painted a sunrise over the lake last week." in top.page_content
    assert top.metadata["conversation_id"] == conv and top.metadata["score"] > 0
    assert top.metadata["sources"] and "fused" in top.metadata["score_parts"]
    assert top.id == top.metadata["memory_id"]
    assert RecollectRetriever(client=client, conversation_ids=[conv + "-none"]).invoke("x") == []
    with pytest.raises(ValueError):
        RecollectRetriever()


@pytest.mark.anyio
async def test_retriever_async(url, client, conv):
    client.store_turn(conv, "The meeting moved to Thursday.", wait=True)
    async with AsyncClient(url, "py-key") as ac:
        docs = await RecollectRetriever(async_client=ac, conversation_ids=[conv], k=3).ainvoke("when is the meeting?")
    assert "Thursday" in docs[0].page_content
    # without an async client the sync one runs in a thread
    docs = await RecollectRetriever(client=client, conversation_ids=[conv], k=3).ainvoke("meeting")
    assert docs and docs[0].metadata["conversation_id"] == conv


def test_user_scoped_history_and_retriever(client, conv):
    user, other = f"u-{uuid.uuid4().hex[:8]}", f"u-{uuid.uuid4().hex[:8]}"
    mine = RecollectChatMessageHistory(conv, client, user_id=user)
    mine.add_messages([HumanMessage("My favourite colour is teal."), AIMessage("Teal it is.")])
    theirs = RecollectChatMessageHistory(conv + "-other", client, user_id=other)
    try:
        theirs.add_messages([HumanMessage("My favourite colour is orange.")])
        assert client.list_conversations(user_id=user).conversations == [conv]
        docs = RecollectRetriever(client=client, user_id=user, k=10).invoke("favourite colour")
        assert [d.metadata["user_id"] for d in docs] == [user]
        assert "teal" in docs[0].page_content and docs[0].metadata["conversation_id"] == conv
        assert [d.metadata["user_id"] for d in RecollectRetriever(client=client, user_id=other).invoke("colour")] == [
            other
        ]
    finally:
        theirs.clear()


def test_history_needs_a_client():
    with pytest.raises(ValueError):
        RecollectChatMessageHistory("c")
    assert isinstance(RecollectChatMessageHistory("c", Client("http://127.0.0.1:9")), RecollectChatMessageHistory)
