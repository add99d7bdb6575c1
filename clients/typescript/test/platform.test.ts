/** End users, agents and filters, listing by user, erasing one memory, edits with their history
 * and asOf, reindex, and the 409 on a conflicting turn id, against the live server. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import {
  BadRequestError,
  ConflictError,
  NotFoundError,
  RecollectClient,
  type TurnInputLike,
} from "../src/index.js";
import { KEY, LIVE_URL, OTHER_KEY, conv, skipLive } from "./helpers.js";

const client = (key = KEY) => new RecollectClient({ baseUrl: LIVE_URL, apiKey: key });

function turns(user: string, n: number, channel: string): TurnInputLike[] {
  return Array.from({ length: n }, (_, i) => ({
    turn_id: `${user}-${i}`,
    user: `I went kayaking near Lisbon again, trip ${i}.`,
    assistant: "Sounds lovely.",
    timestamp: `2024-03-${String(i + 1).padStart(2, "0")}T10:00:00Z`,
    user_id: user,
    agent_id: "coach",
    metadata: { channel, trip: i },
  }));
}

/** Two end users, each in a conversation of their own; erased afterwards. */
type Users = [[string, string], [string, string]];
async function withTwoUsers(fn: (rc: RecollectClient, users: Users) => Promise<void>) {
  const rc = client();
  const tag = randomUUID().slice(0, 8);
  const users: Users = [
    [`u-${tag}-a`, conv()],
    [`u-${tag}-b`, conv()],
  ];
  try {
    await rc.storeTurns(users[0][1], turns(users[0][0], 4, "web"), { wait: true });
    await rc.storeTurns(users[1][1], turns(users[1][0], 6, "app"), { wait: true });
    await fn(rc, users);
  } finally {
    for (const [, c] of users) await rc.deleteConversation(c).catch(() => undefined);
  }
}

test("recall scoped to end users, metadata and a time range", { skip: skipLive }, () =>
  withTwoUsers(async (rc, [[a, convA], [b]]) => {
    const mine = (await rc.recall({ query: "kayaking Lisbon", user_ids: [a], k: 50 })).memories;
    assert.equal(mine.length, 4);
    assert.ok(mine.every((m) => m.user_id === a && m.conversation_id === convA && m.agent_id === "coach"));
    assert.ok(mine.every((m) => (m.metadata as Record<string, unknown>)["channel"] === "web"));
    const both = (await rc.recall({ query: "kayaking", user_ids: [a, b], k: 50 })).memories;
    assert.equal(both.length, 10);
    const one = (await rc.recall({ query: "kayaking", user_ids: [a, b], metadata: { channel: "app", trip: 2 } }))
      .memories;
    assert.deepEqual(one.map((m) => m.turn_id), [`${b}-2`]);
    const ranged = (
      await rc.recall({
        query: "kayaking",
        user_ids: [a, b],
        from: new Date("2024-03-02T00:00:00Z"),
        to: "2024-03-04T00:00:00Z",
        k: 50,
      })
    ).memories;
    assert.deepEqual(ranged.map((m) => new Date(m.timestamp).getUTCDate()).sort(), [2, 2, 3, 3]);
    await assert.rejects(
      rc.recall({ query: "kayaking", metadata: { tags: ["x"] } as unknown as Record<string, string> }),
      (e: unknown) => e instanceof BadRequestError && e.message.includes("metadata.tags"),
    );
  }));

test("listConversations and iterConversations by end user", { skip: skipLive }, () =>
  withTwoUsers(async (rc, [[a, convA], [b, convB]]) => {
    assert.deepEqual((await rc.listConversations({ user_id: a })).conversations, [convA]);
    const theirs: string[] = [];
    for await (const c of rc.iterConversations({ user_id: b, limit: 1 })) theirs.push(c);
    assert.deepEqual(theirs, [convB]);
    assert.deepEqual((await client(OTHER_KEY).listConversations({ user_id: a })).conversations, []);
    await assert.rejects(rc.listConversations({ user_id: "a b" }), BadRequestError);
  }));

test("storeTurn with an end user and agent; speakers and Date bounds; listing by agent", { skip: skipLive }, async () => {
  const rc = client();
  const id = conv();
  const tag = randomUUID().slice(0, 8);
  const [user, agent] = [`u-${tag}-one`, `agent-${tag}`];
  try {
    for (const day of [1, 5]) {
      await rc.storeTurn(
        id,
        {
          user: `Booked the ferry to Porto on day ${day}.`,
          timestamp: new Date(Date.UTC(2024, 4, day, 9)),
          user_speaker: "Ana",
          user_id: user,
          agent_id: agent,
          metadata: { kind: "booking" },
        },
        { wait: true },
      );
    }
    const got = (
      await rc.recall({
        query: "ferry Porto",
        user_ids: [user],
        from: new Date("2024-05-03T00:00:00Z"),
        to: new Date("2024-06-01T00:00:00Z"),
        k: 10,
      })
    ).memories;
    assert.deepEqual(
      got.map((m) => [new Date(m.timestamp).getUTCDate(), m.user_id, m.agent_id, m.metadata]),
      [[5, user, agent, { kind: "booking" }]],
    );
    assert.equal((await rc.recall({ query: "ferry", agent_ids: [agent], speakers: ["Ana"] })).memories.length, 2);
    assert.deepEqual((await rc.recall({ query: "ferry", agent_ids: [agent], speakers: ["Bob"] })).memories, []);
    const listed: string[] = [];
    for await (const c of rc.iterConversations({ agent_id: agent })) listed.push(c);
    assert.deepEqual(listed, [id]);
  } finally {
    await rc.deleteConversation(id).catch(() => undefined);
  }
});

test("deleteMemory erases one turn; a conflicting turn id is a ConflictError", { skip: skipLive }, async () => {
  const rc = client();
  const id = conv();
  try {
    const ids = (await rc.storeTurns(id, turns("u-del", 3, "web"), { wait: true })).memory_ids;
    await assert.rejects(client(OTHER_KEY).deleteMemory(ids[1]!), NotFoundError);
    const erased = await rc.deleteMemory(ids[1]!);
    assert.deepEqual(erased, { memory_id: ids[1]!, conversation_id: id, turn_id: "u-del-1" });
    await assert.rejects(rc.getMemory(ids[1]!), NotFoundError);
    await assert.rejects(rc.deleteMemory(ids[1]!), NotFoundError);
    const left: string[] = [];
    for await (const t of rc.iterTurns(id)) left.push(t.memory_id ?? "");
    assert.deepEqual(left, [ids[0], ids[2]]);

    const changed = { ...turns("u-del", 1, "web")[0]!, user: "Something else entirely." };
    await assert.rejects(rc.storeTurns(id, [changed]), (e: unknown) => {
      return (
        e instanceof ConflictError &&
        e.status === 409 &&
        e.code === "conflict" &&
        e.message.includes("PATCH /v1/memories/")
      );
    });
  } finally {
    await rc.deleteConversation(id).catch(() => undefined);
  }
});

test("editMemory keeps the old version in the history and for asOf; reindex", { skip: skipLive }, async () => {
  const rc = client();
  const id = conv();
  try {
    const unstored = new Date();
    await new Promise((r) => setTimeout(r, 50));
    const ids = (await rc.storeTurns(id, turns("u-edit", 2, "web"), { wait: true })).memory_ids;
    const before = new Date();
    await new Promise((r) => setTimeout(r, 50));
    const v2 = await rc.editMemory(ids[0]!, {
      user: "I went sailing near Porto instead.",
      metadata: { fixed: true },
      wait: true,
    });
    assert.equal(v2.version, 2);
    assert.deepEqual(v2.metadata, { fixed: true }, "metadata is replaced whole");
    assert.equal(v2.assistant, "Sounds lovely.");
    const same = await rc.editMemory(ids[0]!, { user: "I went sailing near Porto instead.", metadata: { fixed: true } });
    assert.equal(same.version, 2, "the same edit again makes no version");
    const h = await rc.memoryHistory(ids[0]!);
    assert.equal(h.memory_id, ids[0]);
    assert.equal(h.versions.length, 2);
    assert.ok(h.versions[0]!.expired_at && h.versions[0]!.user.includes("kayaking"));
    assert.equal(h.versions[1]!.expired_at, undefined);
    assert.deepEqual(h.versions[0]!.metadata, { channel: "web", trip: 0 });
    assert.equal(v2.first_recorded_at, h.versions[0]!.recorded_at);
    assert.equal(h.versions[0]!.expired_at, v2.recorded_at);
    assert.ok((await rc.getMemory(ids[0]!, { asOf: before })).user.includes("kayaking"));
    assert.equal((await rc.getMemory(ids[0]!, { asOf: v2.recorded_at! })).version, 2);
    await assert.rejects(rc.getMemory(ids[0]!, { asOf: unstored }), NotFoundError, "nothing held yet then");
    assert.ok((await rc.getMemory(ids[0]!)).user.includes("sailing"));
    const old = await rc.recall({ query: "sailing Porto", conversation_ids: [id], k: 5, as_of: before });
    assert.ok(old.memories.every((m) => !m.user.includes("sailing")));
    await assert.rejects(rc.editMemory(ids[0]!, {}), BadRequestError);
    await assert.rejects(
      rc.editMemory(ids[0]!, { user: "  " }),
      (e: unknown) => e instanceof BadRequestError && e.code === "invalid_argument" && e.message.includes("user"),
    );
    await assert.rejects(rc.editMemory(randomUUID(), { user: "no such memory" }), NotFoundError);
    await assert.rejects(client(OTHER_KEY).editMemory(ids[0]!, { user: "not yours" }), NotFoundError);
    await assert.rejects(client(OTHER_KEY).memoryHistory(ids[0]!), NotFoundError);
    assert.ok((await rc.reindex()).turns >= 2);
  } finally {
    await rc.deleteConversation(id).catch(() => undefined);
  }
});
