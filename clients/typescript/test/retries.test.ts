/** Retries, Retry-After, timeouts and transport failures: against the rate-limited live server
 * where it can produce them (429, 413), against a scripted mock server for the rest. */
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  BadRequestError,
  NotFoundError,
  PayloadTooLargeError,
  RateLimitError,
  RecollectClient,
  RecollectConnectionError,
  RecollectTimeoutError,
  ServerError,
  ServiceUnavailableError,
  parseRetryAfter,
} from "../src/index.js";
import {
  BIG_KEY,
  INFO_OK,
  LIMITED_KEY,
  LIMITED_URL,
  MockServer,
  STORE_OK,
  closedPort,
  error,
  skipLimited,
} from "./helpers.js";

async function drain(rc: RecollectClient): Promise<void> {
  for (let i = 0; i < 5; i++) {
    try {
      await rc.recall("drain the bucket");
    } catch (e) {
      if (e instanceof RateLimitError) return;
      throw e;
    }
  }
  throw new Error("the limited server never answered 429");
}

async function withMock(fn: (mock: MockServer) => Promise<void>): Promise<void> {
  const mock = await MockServer.start();
  try {
    await fn(mock);
  } finally {
    await mock.close();
  }
}

// ---- live: the rate-limited server (1 request/s per tenant, burst 1) ------------------------------

test("429 without retries carries code, message and Retry-After", { skip: skipLimited }, async () => {
  const rc = new RecollectClient({ baseUrl: LIMITED_URL, apiKey: LIMITED_KEY, maxRetries: 0 });
  await drain(rc);
  await assert.rejects(rc.recall("again at once"), (e: unknown) => {
    assert.ok(e instanceof RateLimitError);
    assert.equal(e.status, 429);
    assert.equal(e.code, "rate_limited");
    assert.match(e.message, /too many requests/);
    assert.equal(e.retryAfter, 1);
    return true;
  });
});

test("429 is retried after Retry-After", { skip: skipLimited }, async () => {
  await drain(new RecollectClient({ baseUrl: LIMITED_URL, apiKey: LIMITED_KEY, maxRetries: 0 }));
  const rc = new RecollectClient({ baseUrl: LIMITED_URL, apiKey: LIMITED_KEY, maxRetries: 3 });
  const start = performance.now();
  await rc.recall("first, after waiting for a token");
  await rc.recall("second, after waiting again");
  assert.ok(performance.now() - start >= 1900, `took ${performance.now() - start} ms`);
});

test("a Retry-After beyond maxRetryAfter throws at once", { skip: skipLimited }, async () => {
  const rc = new RecollectClient({ baseUrl: LIMITED_URL, apiKey: LIMITED_KEY, retry: { maxRetries: 1, maxRetryAfter: 0.5 } });
  await drain(rc);
  const start = performance.now();
  await assert.rejects(rc.storeTurn("limited", { user: "not now" }), (e: unknown) => e instanceof RateLimitError && e.retryAfter === 1);
  assert.ok(performance.now() - start < 500);
});

test("413 PayloadTooLargeError", { skip: skipLimited }, async () => {
  const rc = new RecollectClient({ baseUrl: LIMITED_URL, apiKey: BIG_KEY });
  await assert.rejects(rc.recall("x".repeat(5000)), (e: unknown) => {
    assert.ok(e instanceof PayloadTooLargeError && e instanceof BadRequestError);
    assert.equal(e.status, 413);
    assert.equal(e.code, "too_large");
    return true;
  });
});

// ---- mock server ----------------------------------------------------------------------------------

test("503 overloaded is retried even for a store, after Retry-After", () =>
  withMock(async (mock) => {
    mock.script({ status: 503, body: error("overloaded", "busy"), headers: { "retry-after": "1" } }, { status: 202, body: STORE_OK });
    const rc = new RecollectClient({ baseUrl: mock.url });
    assert.equal(await rc.storeTurn("c", { user: "hello" }), STORE_OK.memory_ids[0]);
    assert.equal(mock.seen.length, 2);
    assert.ok(mock.seen[1]!.at - mock.seen[0]!.at >= 950);
    assert.equal(mock.seen[0]!.body, mock.seen[1]!.body);
  }));

test("other 503s are retried only when idempotent", () =>
  withMock(async (mock) => {
    const unavailable = { status: 503, body: error("unavailable", "stored, enrichment did not finish"), headers: { "retry-after": "0" } };
    mock.script(unavailable);
    const rc = new RecollectClient({ baseUrl: mock.url });
    await assert.rejects(rc.storeTurn("c", { user: "x" }, { wait: true }), (e: unknown) => e instanceof ServiceUnavailableError && e.code === "unavailable");
    assert.equal(mock.seen.length, 1);
    mock.script(unavailable, { status: 202, body: STORE_OK });
    assert.equal(await rc.storeTurn("c", { user: "x", turn_id: "t1" }), STORE_OK.memory_ids[0]);
    assert.equal(mock.seen.length, 3);
  }));

test("Retry-After as an HTTP date", () =>
  withMock(async (mock) => {
    const when = new Date(Date.now() + 2000).toUTCString();
    mock.script({ status: 429, body: error("rate_limited", "slow"), headers: { "retry-after": when } }, { body: INFO_OK });
    const start = performance.now();
    await new RecollectClient({ baseUrl: mock.url }).conversationInfo("c");
    const took = performance.now() - start;
    assert.ok(took >= 900 && took <= 3500, `took ${took}`);
  }));

test("attempts are bounded; client errors are never retried", () =>
  withMock(async (mock) => {
    mock.script({ status: 429, body: error("rate_limited", "slow"), headers: { "retry-after": "0" } });
    await assert.rejects(new RecollectClient({ baseUrl: mock.url, maxRetries: 2 }).recall("q"), RateLimitError);
    assert.equal(mock.seen.length, 3);
    mock.script({ status: 404, body: error("not_found", 'conversation "c" not found') });
    await assert.rejects(new RecollectClient({ baseUrl: mock.url }).conversationInfo("c"), NotFoundError);
    assert.equal(mock.seen.length, 4);
  }));

test("no Retry-After: exponential backoff", () =>
  withMock(async (mock) => {
    mock.script({ status: 503, body: error("overloaded", "busy") }, { status: 503, body: error("overloaded", "busy") }, { body: INFO_OK });
    await new RecollectClient({ baseUrl: mock.url, retry: { backoff: 0.2, maxBackoff: 0.2 } }).conversationInfo("c");
    const gaps = mock.seen.slice(1).map((s, i) => s.at - mock.seen[i]!.at);
    assert.equal(gaps.length, 2);
    assert.ok(gaps.every((g) => g >= 90 && g <= 1000), String(gaps));
  }));

test("a non-JSON 502 from a proxy", () =>
  withMock(async (mock) => {
    mock.script({ status: 502, raw: "Bad Gateway from the ingress" }, { body: INFO_OK });
    const rc = new RecollectClient({ baseUrl: mock.url, retry: { backoff: 0.01 } });
    assert.deepEqual(await rc.conversationInfo("c"), INFO_OK);
    mock.script({ status: 502, raw: "Bad Gateway from the ingress" });
    await assert.rejects(rc.storeTurn("c", { user: "x" }), (e: unknown) => {
      assert.ok(e instanceof ServerError);
      assert.equal(e.code, "http_502");
      assert.equal(e.message, "Bad Gateway from the ingress");
      return true;
    });
  }));

test("timeouts are typed and retried only when idempotent", () =>
  withMock(async (mock) => {
    mock.script({ body: INFO_OK, delayMs: 1000 });
    const rc = new RecollectClient({ baseUrl: mock.url, timeoutMs: 200, retry: { maxRetries: 1, backoff: 0.01 } });
    await assert.rejects(rc.conversationInfo("c"), RecollectTimeoutError);
    assert.equal(mock.seen.length, 2);
    await assert.rejects(rc.storeTurn("c", { user: "maybe stored, so not repeated" }), RecollectTimeoutError);
    assert.equal(mock.seen.length, 3);
    assert.deepEqual(await rc.conversationInfo("c", { timeoutMs: 3000 }), INFO_OK);
  }));

test("an AbortSignal cancels the call and the retry wait", () =>
  withMock(async (mock) => {
    mock.script({ status: 429, body: error("rate_limited", "slow"), headers: { "retry-after": "5" } });
    const rc = new RecollectClient({ baseUrl: mock.url });
    const start = performance.now();
    await assert.rejects(rc.recall("q", { signal: AbortSignal.timeout(300) }), (e: unknown) => (e as Error).name === "TimeoutError");
    assert.ok(performance.now() - start < 2000);
  }));

test("connection refused is retried, then a RecollectConnectionError", async () => {
  const port = await closedPort();
  const rc = new RecollectClient({ baseUrl: `http://127.0.0.1:${port}`, retry: { maxRetries: 2, backoff: 0.05 } });
  await assert.rejects(rc.storeTurn("c", { user: "never sent, so safe to retry" }), (e: unknown) => {
    assert.ok(e instanceof RecollectConnectionError);
    assert.match(e.message, /ECONNREFUSED/);
    return true;
  });
  assert.equal(await rc.isReady(), false);
});

test("parseRetryAfter", () => {
  assert.equal(parseRetryAfter("3"), 3);
  assert.equal(parseRetryAfter(" 1.5 "), 1.5);
  assert.equal(parseRetryAfter(null), undefined);
  assert.equal(parseRetryAfter("soon"), undefined);
  assert.equal(parseRetryAfter("-4"), 0);
  const now = 1_700_000_000_000;
  assert.equal(parseRetryAfter(new Date(now + 30_000).toUTCString(), now), 30);
  assert.equal(parseRetryAfter(new Date(now - 30_000).toUTCString(), now), 0);
});
