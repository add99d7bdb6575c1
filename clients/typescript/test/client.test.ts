/** The client against a live server: every operation of the HTTP API and its error paths. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import {
  AuthenticationError,
  BadRequestError,
  NotFoundError,
  RecollectClient,
  UnexpectedResponseError,
  type TurnInputLike,
} from "../src/index.js";
import {
  ERASE_KEY,
  INFO_OK,
  KEY,
  LIVE_URL,
  MockServer,
  OTHER_KEY,
  README_TURNS,
  TENANT,
  conv,
  error,
  skipLive,
} from "./helpers.js";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const client = () => new RecollectClient({ baseUrl: LIVE_URL, apiKey: KEY });

async function withConv(fn: (rc: RecollectClient, id: string) => Promise<void>): Promise<void> {
  const rc = client();
  const id = conv();
  try {
    await fn(rc, id);
  } finally {
    await rc.deleteConversation(id).catch(() => undefined);
  }
}

test("store and recall the README session", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    const stored = await rc.storeTurns(id, README_TURNS, { wait: true });
    assert.equal(stored.memory_ids.length, 2);
    assert.ok(stored.memory_ids.every((m) => UUID.test(m)));
    const { memories } = await rc.recall({ query: "What did Melanie paint?", conversation_ids: [id], k: 5 });
    const top = memories[0]!;
    assert.equal(top.memory_id, stored.memory_ids[1]);
    assert.equal(top.user, "I painted a sunrise over the lake last week.");
    assert.equal(top.user_speaker, "Melanie");
    assert.equal(top.conversation_id, id);
    assert.equal(new Date(top.timestamp).toISOString(), "2023-05-08T14:01:00.000Z");
    assert.ok(top.score > 0 && typeof top.score_parts.fused === "number");
    assert.ok(top.sources.length > 0);
    const scores = memories.map((m) => m.score);
    assert.deepEqual(scores, [...scores].sort((a, b) => b - a));
  }));

test("storeTurn with a Date round-trips through getMemory", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    const when = new Date("2024-02-29T23:30:00-05:00");
    const mid = await rc.storeTurn(
      id,
      {
        user: "We adopted a puppy named Biscuit.",
        assistant: "What a lovely name!",
        timestamp: when,
        turn_id: "t-1",
        user_speaker: "Ana",
        assistant_speaker: "Bot",
        metadata: { channel: "web", n: [1, 2] },
      },
      { wait: true },
    );
    const t = await rc.getMemory(mid);
    assert.equal(t.memory_id, mid);
    assert.equal(t.tenant, TENANT);
    assert.equal(t.turn_id, "t-1");
    assert.equal(t.position, 0);
    assert.equal(t.assistant, "What a lovely name!");
    assert.equal(new Date(t.timestamp).getTime(), when.getTime());
    assert.deepEqual(t.metadata, { channel: "web", n: [1, 2] });
    assert.equal(t.extraction?.extractor, "rules");
    assert.ok(["Ana", "Biscuit"].every((e) => t.extraction!.entities.includes(e)));
    assert.deepEqual(t.fragments, []);
  }));

test("turn ids make a repeated store idempotent", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    const turns: TurnInputLike[] = [{ turn_id: "a", user: "first", timestamp: "2024-01-01T00:00:00Z" }];
    const a = await rc.storeTurns(id, turns, { wait: true });
    const b = await rc.storeTurns(id, turns, { wait: true });
    assert.deepEqual(a.memory_ids, b.memory_ids);
    assert.equal((await rc.conversationInfo(id)).turns, 1);
  }));

test("conversationInfo, getMemories and storeTurnsBatched", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    function* turns() {
      for (let i = 0; i < 23; i++) yield { user: `line ${i}`, timestamp: new Date(Date.UTC(2024, 0, 1, 0, i)) };
    }
    const ids = await rc.storeTurnsBatched(id, turns(), { batchSize: 10, wait: true });
    assert.equal(new Set(ids).size, 23);
    const info = await rc.conversationInfo(id);
    assert.deepEqual(info, { conversation_id: id, turns: 23, pending: 0, recallable: 23 });
    const got = await rc.getMemories([...ids].reverse(), { concurrency: 4 });
    assert.deepEqual(
      got.map((t) => t.position),
      Array.from({ length: 23 }, (_, i) => 22 - i),
    );
  }));

test("listTurns pages in order; iterTurns walks every page", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    const turns = Array.from({ length: 7 }, (_, i) => ({
      turn_id: `t${i}`,
      user: `Day ${i}: we hiked to the lighthouse.`,
      timestamp: `2024-05-0${i + 1}T10:00:00Z`,
    }));
    const { memory_ids } = await rc.storeTurns(id, turns, { wait: true });
    const first = await rc.listTurns(id, { limit: 3 });
    assert.deepEqual(first.turns.map((t) => t.turn_id), ["t0", "t1", "t2"]);
    assert.ok(first.next_cursor);
    const second = await rc.listTurns(id, { limit: 3, cursor: first.next_cursor });
    assert.deepEqual(second.turns.map((t) => t.position), [3, 4, 5]);
    const last = await rc.listTurns(id, { limit: 3, cursor: second.next_cursor });
    assert.deepEqual(last.turns.map((t) => t.position), [6]);
    assert.ok(!last.next_cursor);
    const walked = [];
    for await (const t of rc.iterTurns(id, { limit: 2 })) walked.push(t);
    assert.deepEqual(walked.map((t) => t.memory_id), memory_ids);
    assert.ok(walked.every((t) => t.extraction?.keywords.some((k) => k.text === "lighthouse")));
  }));

test("listConversations pages in ascending order; listing errors", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    const mine = ["c", "a", "b"].map((x) => `${id}-${x}`);
    try {
      for (const c of mine) await rc.storeTurn(c, { user: "listed" }, { wait: true });
      const listed: string[] = [];
      for await (const c of rc.iterConversations({ limit: 2 })) listed.push(c);
      assert.deepEqual(listed, [...listed].sort());
      assert.deepEqual(listed.filter((c) => c.startsWith(id)), [...mine].sort());
      const bad = (p: Promise<unknown>, re: RegExp) =>
        assert.rejects(p, (e: unknown) => e instanceof BadRequestError && e.code === "invalid_argument" && re.test(e.message));
      await bad(rc.listTurns(mine[0]!, { limit: 0 }), /^limit/);
      await bad(rc.listTurns(mine[0]!, { limit: 501 }), /^limit/);
      await bad(rc.listTurns(mine[0]!, { cursor: "garbage" }), /^cursor/);
      await assert.rejects(rc.listTurns(`${id}-missing`), NotFoundError);
      const other = new RecollectClient({ baseUrl: LIVE_URL, apiKey: OTHER_KEY });
      await assert.rejects(other.listTurns(mine[0]!), NotFoundError);
      for await (const c of other.iterConversations()) assert.ok(!c.startsWith(id));
    } finally {
      for (const c of mine) await rc.deleteConversation(c);
    }
  }));

test("recall filters by conversation and takes now and attention_state", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    const other = `${id}-b`;
    try {
      await rc.storeTurn(id, { user: "We went hiking at Mount Tam last Saturday.", timestamp: "2024-05-13T09:00:00Z" }, { wait: true });
      await rc.storeTurn(other, { user: "I went hiking in the Alps." }, { wait: true });
      const all = await rc.recall("hiking");
      assert.ok([id, other].every((c) => all.memories.some((m) => m.conversation_id === c)));
      const only = await rc.recall({
        query: "where did we go hiking last week?",
        conversation_ids: [id],
        k: 3,
        now: new Date("2024-05-15T00:00:00Z"),
        attention_state: {
          entities: ["Mount Tam"],
          locations: ["Mount Tam"],
          events: [],
          times: [{ text: "last Saturday", start: "2024-05-11", end: "2024-05-11", granularity: "day" }],
          bindings: {},
          turns_seen: 1,
        },
      });
      assert.deepEqual(new Set(only.memories.map((m) => m.conversation_id)), new Set([id]));
      assert.match(only.memories[0]!.user, /Mount Tam/);
    } finally {
      await rc.deleteConversation(other);
    }
  }));

test("ids with every allowed character", { skip: skipLive }, async () => {
  const rc = client();
  const id = `chat:${conv().slice(3, 11)}@team.a_b-c`;
  const mid = await rc.storeTurn(id, { user: "punctuation" }, { wait: true });
  assert.equal((await rc.getMemory(mid)).conversation_id, id);
  assert.equal((await rc.deleteConversation(id)).turns_erased, 1);
});

test("deleteConversation erases everything", { skip: skipLive }, async () => {
  const rc = client();
  const id = conv();
  const { memory_ids } = await rc.storeTurns(id, README_TURNS, { wait: true });
  assert.deepEqual(await rc.deleteConversation(id), { conversation_id: id, turns_erased: 2 });
  await assert.rejects(rc.conversationInfo(id), (e: unknown) => {
    assert.ok(e instanceof NotFoundError);
    assert.equal(e.status, 404);
    assert.equal(e.code, "not_found");
    assert.match(e.message, new RegExp(id));
    return true;
  });
  await assert.rejects(rc.getMemory(memory_ids[0]!), NotFoundError);
});

test("eraseTenant", { skip: skipLive }, async () => {
  const rc = new RecollectClient({ baseUrl: LIVE_URL, apiKey: ERASE_KEY });
  await rc.storeTurns("te-1", README_TURNS, { wait: true });
  await rc.storeTurn("te-2", { user: "one more" }, { wait: true });
  await assert.rejects(rc.eraseTenant("someone-else"), (e: unknown) => e instanceof BadRequestError && /confirm/.test(e.message));
  assert.deepEqual(await rc.eraseTenant("ts-erase"), { conversations_erased: 2, turns_erased: 3 });
  assert.deepEqual((await rc.recall("Melanie")).memories, []);
  assert.throws(() => rc.eraseTenant(""), TypeError);
});

test("tenants are isolated", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    const mid = await rc.storeTurn(id, { user: "The vault code is 4711." }, { wait: true });
    const other = new RecollectClient({ baseUrl: LIVE_URL, apiKey: OTHER_KEY });
    await assert.rejects(other.getMemory(mid), NotFoundError);
    await assert.rejects(other.conversationInfo(id), NotFoundError);
    assert.ok((await other.recall({ query: "vault code", k: 50 })).memories.every((m) => m.memory_id !== mid));
  }));

test("operations endpoints", { skip: skipLive }, async () => {
  const rc = client();
  assert.equal((await rc.healthz()).trim(), "ok");
  assert.equal((await rc.readyz()).trim(), "ready");
  assert.equal(await rc.isReady(), true);
  await rc.waitUntilReady(5_000);
  assert.match(await rc.metrics(), /recollect_http_requests_total/);
  const doc = await rc.openapi();
  const snapshot = JSON.parse(readFileSync(new URL("../../../openapi.json", import.meta.url), "utf8"));
  assert.deepEqual(doc, snapshot); // the document the types were generated from
});

// ---- error paths ---------------------------------------------------------------------------------

test("an unknown key is a 401 AuthenticationError", { skip: skipLive }, async () => {
  const rc = new RecollectClient({ baseUrl: LIVE_URL, apiKey: "not-a-key" });
  await assert.rejects(rc.recall("anything"), (e: unknown) => {
    assert.ok(e instanceof AuthenticationError);
    assert.equal(e.status, 401);
    assert.equal(e.code, "unauthenticated");
    assert.equal(e.message, "unknown API key");
    assert.equal(e.method, "POST");
    assert.match(e.url, /\/v1\/recall$/);
    assert.equal(e.name, "AuthenticationError");
    return true;
  });
  const none = new RecollectClient({ baseUrl: LIVE_URL, apiKey: "" });
  await assert.rejects(none.conversationInfo("x"), (e: unknown) => e instanceof AuthenticationError && /Authorization/.test(e.message));
});

test("invalid input is a 400 naming the field; nothing stored", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    const bad = (p: Promise<unknown>, re: RegExp) =>
      assert.rejects(p, (e: unknown) => e instanceof BadRequestError && e.status === 400 && e.code === "invalid_argument" && re.test(e.message));
    await bad(rc.storeTurns(id, [{ user: "   ", timestamp: "2024-01-01T00:00:00Z" }]), /turns\[0\]\.user/);
    await bad(rc.storeTurns(id, [{ user: "x", timestamp: "not a time" }]), /timestamp/);
    await bad(rc.recall({ query: "x", k: 0 }), /k must be in 1\.\.=1000/);
    await bad(rc.storeTurn("not a valid id", { user: "hello" }), /conversation id/);
    await bad(rc.storeTurns(id, []), /at least one turn/);
    // unknown fields are refused by the server, not silently dropped
    await bad(rc.request("POST", "/v1/recall", { body: { query: "x", tenant: "someone-else" } }), /unknown field `tenant`/);
    await assert.rejects(rc.conversationInfo(id), NotFoundError);
  }));

test("not a memory id is 400, an unknown one 404", { skip: skipLive }, async () => {
  const rc = client();
  await assert.rejects(rc.getMemory("abc"), (e: unknown) => e instanceof BadRequestError && /not a memory id/.test(e.message));
  await assert.rejects(rc.getMemory(crypto.randomUUID()), NotFoundError);
  assert.throws(() => rc.getMemory(""), TypeError);
});

test("request() returns status, headers and parsed body", { skip: skipLive }, () =>
  withConv(async (rc, id) => {
    await rc.storeTurn(id, { user: "raw access" }, { wait: true });
    const res = await rc.request("GET", `/v1/conversations/${id}`);
    assert.equal(res.status, 200);
    assert.equal((res.body as { turns: number }).turns, 1);
    assert.match(res.headers.get("content-type") ?? "", /json/);
  }));

test("a success that breaks the schema is UnexpectedResponseError; headers sent", async () => {
  const mock = await MockServer.start();
  try {
    mock.script({ body: { conversation_id: "c" } }, { raw: "<html>" }, { body: INFO_OK });
    const rc = new RecollectClient({ baseUrl: mock.url, apiKey: "secret", headers: { "x-request-id": "r-1" } });
    await assert.rejects(rc.conversationInfo("c"), (e: unknown) => e instanceof UnexpectedResponseError && /missing turns/.test(e.message));
    await assert.rejects(rc.conversationInfo("c"), UnexpectedResponseError);
    assert.deepEqual(await rc.conversationInfo("c"), INFO_OK);
    const h = mock.seen[0]!.headers;
    assert.equal(h["authorization"], "Bearer secret");
    assert.equal(h["x-request-id"], "r-1");
    assert.match(String(h["user-agent"]), /^recollect-memory-client-typescript\//);
  } finally {
    await mock.close();
  }
});

// A memory edited once, as the server answers for it: version 1 (expired; `version` left out at 1)
// and version 2 (current, with `first_recorded_at`).
const MEMORY_ID = "94136752-401a-4159-b7f0-655356953cfa";
const TURN_V1 = {
  memory_id: MEMORY_ID,
  tenant: "t",
  conversation_id: "c",
  turn_id: "0",
  position: 0,
  user: "I like kayaking",
  assistant: "nice",
  timestamp: "2024-01-01T00:00:00Z",
  recorded_at: "2026-11-24T08:40:38.191033Z",
  metadata: { a: 1 },
  expired_at: "2026-11-24T08:40:38.311248Z",
};
const { expired_at: _expired, ...TURN_V1_FIELDS } = TURN_V1;
const TURN_V2 = {
  ...TURN_V1_FIELDS,
  user: "I like sailing",
  recorded_at: "2026-11-24T08:40:38.311248Z",
  metadata: { b: 2 },
  version: 2,
  first_recorded_at: "2026-11-24T08:40:38.191033Z",
};

test("editMemory, memoryHistory and asOf on the wire; their errors", async () => {
  const mock = await MockServer.start();
  try {
    mock.script(
      // An edit is retried: the same one again makes no new version.
      { status: 503, body: error("unavailable", "raw store busy") },
      { status: 202, body: TURN_V2 },
      { status: 202, body: TURN_V2 },
      { body: { memory_id: MEMORY_ID, versions: [TURN_V1, TURN_V2] } },
      { body: { ...TURN_V1, fragments: [] } },
      { body: { ...TURN_V1, fragments: [] } },
      { body: { memories: [] } },
      { status: 400, body: error("invalid_argument", "patch.user is empty or whitespace") },
      { status: 404, body: error("not_found", `memory ${MEMORY_ID} not found as of 2020-01-01T00:00:00+00:00`) },
      { status: 202, body: { memory_id: MEMORY_ID } },
    );
    const rc = new RecollectClient({ baseUrl: mock.url, apiKey: "k", retry: { maxRetries: 1, backoff: 0.01 } });
    const v2 = await rc.editMemory(MEMORY_ID, { user: "I like sailing", metadata: { b: 2 } });
    assert.equal(v2.version, 2);
    assert.equal(v2.first_recorded_at, "2026-11-24T08:40:38.191033Z");
    assert.deepEqual(v2.metadata, { b: 2 });
    await rc.editMemory(MEMORY_ID, { assistant: "", wait: true });
    const h = await rc.memoryHistory(MEMORY_ID);
    assert.equal(h.memory_id, MEMORY_ID);
    assert.deepEqual(h.versions.map((v) => v.user), ["I like kayaking", "I like sailing"]);
    assert.equal(h.versions[0]!.expired_at, v2.recorded_at);
    assert.equal(h.versions[0]!.version, undefined);
    const asOf = new Date("2026-11-24T08:40:38.250Z");
    assert.equal((await rc.getMemory(MEMORY_ID, { asOf })).user, "I like kayaking");
    await rc.getMemory(MEMORY_ID, { asOf: "2026-11-24T09:40:38.25+01:00" });
    await rc.recall({ query: "sailing", as_of: asOf });
    await assert.rejects(
      rc.editMemory(MEMORY_ID, { user: "" }),
      (e: unknown) => e instanceof BadRequestError && e.status === 400 && e.message.includes("patch.user"),
    );
    await assert.rejects(rc.getMemory(MEMORY_ID, { asOf: "2020-01-01T00:00:00Z" }), NotFoundError);
    await assert.rejects(
      rc.editMemory(MEMORY_ID, { user: "x" }),
      (e: unknown) => e instanceof UnexpectedResponseError && /Turn/.test(e.message),
    );

    const path = `/v1/memories/${MEMORY_ID}`;
    const seen = mock.seen.map((s) => {
      const u = new URL(s.path, mock.url);
      return [s.method, u.pathname, u.searchParams.get("as_of")];
    });
    assert.deepEqual(seen, [
      ["PATCH", path, null],
      ["PATCH", path, null],
      ["PATCH", path, null],
      ["GET", `${path}/history`, null],
      ["GET", path, "2026-11-24T08:40:38.250Z"],
      ["GET", path, "2026-11-24T09:40:38.25+01:00"],
      ["POST", "/v1/recall", null],
      ["PATCH", path, null],
      ["GET", path, "2020-01-01T00:00:00Z"],
      ["PATCH", path, null],
    ]);
    // Only what was given; `wait` only when asked for; "" (remove the assistant's text) is sent.
    const body = (i: number) => JSON.parse(mock.seen[i]!.body || "null");
    assert.deepEqual(body(0), { user: "I like sailing", metadata: { b: 2 } });
    assert.deepEqual(body(1), body(0));
    assert.deepEqual(body(2), { assistant: "", wait: true });
    assert.equal(body(3), null);
    assert.equal(body(6).as_of, "2026-11-24T08:40:38.250Z");
    // The offset's "+" is percent-encoded: a raw one would reach the server as a space (a 400).
    assert.ok(!new URL(mock.seen[5]!.path, mock.url).search.includes("+"));
  } finally {
    await mock.close();
  }
});

test("configuration from the environment", async () => {
  const mock = await MockServer.start();
  const saved = { url: process.env["RECOLLECT_URL"], key: process.env["RECOLLECT_API_KEY"] };
  try {
    process.env["RECOLLECT_URL"] = `${mock.url}/`;
    process.env["RECOLLECT_API_KEY"] = "from-env";
    mock.script({ body: INFO_OK });
    const rc = new RecollectClient();
    assert.equal(rc.baseUrl, mock.url);
    await rc.conversationInfo("c");
    assert.equal(mock.seen[0]!.headers["authorization"], "Bearer from-env");
  } finally {
    if (saved.url === undefined) delete process.env["RECOLLECT_URL"];
    else process.env["RECOLLECT_URL"] = saved.url;
    if (saved.key === undefined) delete process.env["RECOLLECT_API_KEY"];
    else process.env["RECOLLECT_API_KEY"] = saved.key;
    await mock.close();
  }
});
