import type { components, paths } from "./schema.js";
import {
  ApiError,
  RecollectConnectionError,
  RecollectTimeoutError,
  UnexpectedResponseError,
  errorClassFor,
} from "./errors.js";
import { chunked, paginateItems } from "./pagination.js";
import {
  DEFAULT_RETRY,
  type RetryPolicy,
  backoffDelay,
  parseRetryAfter,
  retryDelayForStatus,
  retryDelayForTransport,
  sleep,
} from "./retry.js";

export const VERSION = "0.1.0";

// ---- types, all from the generated schema (src/schema.ts, `make clients`) -----------------------

type Schemas = components["schemas"];
type JsonOf<R> = R extends { content: { "application/json": infer B } } ? B : never;

export type TurnInput = Schemas["TurnInput"];
export type StoreRequest = Schemas["StoreRequest"];
export type StoreResponse = JsonOf<paths["/v1/conversations/{id}/turns"]["post"]["responses"][202]>;
export type RecallRequest = Schemas["RecallRequest"];
export type RecallResponse = JsonOf<paths["/v1/recall"]["post"]["responses"][200]>;
export type RecalledMemory = Schemas["RecalledMemory"];
export type ScoreParts = Schemas["ScoreParts"];
export type ReferenceState = Schemas["ReferenceState"];
export type Turn = Schemas["Turn"];
/** A stored turn with what enrichment made of it (`extraction` absent while pending). */
export type TurnView = JsonOf<paths["/v1/memories/{id}"]["get"]["responses"][200]>;
export type Extraction = Schemas["Extraction"];
export type ConversationPage = JsonOf<paths["/v1/conversations"]["get"]["responses"][200]>;
export type TurnPage = JsonOf<paths["/v1/conversations/{id}/turns"]["get"]["responses"][200]>;
/** `?limit=&cursor=` of the listings: limit 1..500 (server default 50). */
export type PageQuery = NonNullable<paths["/v1/conversations"]["get"]["parameters"]["query"]>;
export type ConversationInfo = JsonOf<paths["/v1/conversations/{id}"]["get"]["responses"][200]>;
export type Erased = JsonOf<paths["/v1/conversations/{id}"]["delete"]["responses"][200]>;
export type MemoryErased = JsonOf<paths["/v1/memories/{id}"]["delete"]["responses"][200]>;
export type TenantErased = JsonOf<paths["/v1/tenant"]["delete"]["responses"][200]>;
export type TurnPatch = Schemas["TurnPatch"];
export type MemoryHistory = JsonOf<paths["/v1/memories/{id}/history"]["get"]["responses"][200]>;
export type Reindexing = JsonOf<paths["/v1/reindex"]["post"]["responses"][202]>;
export type ErrorBody = Schemas["ErrorBody"];
export type { components, paths };

/** A turn to store: the API's `TurnInput`, with `timestamp` also as a `Date`. */
export type TurnInputLike = Omit<TurnInput, "timestamp"> & { timestamp: string | Date };
/** `storeTurn`'s turn: `timestamp` defaults to now. */
export type NewTurn = Omit<TurnInputLike, "timestamp"> & { timestamp?: string | Date };
/** A recall request: the API's `RecallRequest`, with `now`, `from` and `to` also as `Date`s. */
export type RecallRequestLike = Omit<RecallRequest, "now" | "from" | "to" | "as_of"> & {
  now?: string | Date | null;
  /** What was held at this transaction time (each turn's version then; nothing recorded later). */
  as_of?: string | Date | null;
  /** Only turns whose timestamp is at or after this. */
  from?: string | Date | null;
  /** Only turns whose timestamp is before this. */
  to?: string | Date | null;
};

export interface ClientOptions {
  /** The server (default: `$RECOLLECT_URL`, else http://127.0.0.1:8080). */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer KEY`; the tenant comes from it (default: `$RECOLLECT_API_KEY`). */
  apiKey?: string;
  /** Per attempt, milliseconds (default 30000). */
  timeoutMs?: number;
  /** Per attempt of a store with `wait: true`, which the server holds until recallable (default 150000). */
  waitTimeoutMs?: number;
  /** Retries on 429/503 and transport failures (default 3); see {@link RetryPolicy}. */
  maxRetries?: number;
  retry?: Partial<RetryPolicy>;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
  /** A fetch implementation (default: the global one). */
  fetch?: typeof fetch;
}

export interface CallOptions {
  /** Overrides the client's timeout for this call, milliseconds. */
  timeoutMs?: number;
  /** Aborts the call (and any retry wait). */
  signal?: AbortSignal;
}

export interface StoreOptions extends CallOptions {
  /** Answer only once the turns are recallable (default: once stored durably). */
  wait?: boolean;
}

export interface PageOptions extends CallOptions {
  /** Items per page, 1..500 (server default 50). */
  limit?: number;
  /** The `next_cursor` of the previous page; absent for the first one. */
  cursor?: string | null;
}

/** Paging of the conversation listing, optionally one end user's or agent's conversations. */
export interface ConversationPageOptions extends PageOptions {
  /** Only conversations with a turn of this end user. */
  user_id?: string;
  /** Only conversations with a turn of this agent. */
  agent_id?: string;
}

export interface RawRequestOptions extends CallOptions {
  body?: unknown;
  query?: Record<string, string>;
  /** Whether the request may be repeated (default: by method: GET, HEAD, PUT, DELETE, OPTIONS). */
  idempotent?: boolean;
}

export interface RawResponse {
  status: number;
  headers: Headers;
  /** Parsed JSON, or the text when the body is not JSON. */
  body: unknown;
}

interface Call<T> {
  method: string;
  path: string;
  body?: unknown;
  query?: Record<string, string> | undefined;
  idempotent: boolean;
  retry: boolean;
  timeoutMs?: number | undefined;
  signal?: AbortSignal | undefined;
  accept: string;
  parse: (res: Response, text: string, url: string) => T;
}

function env(name: string): string | undefined {
  const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const v = p?.env?.[name];
  return v ? v : undefined;
}

/** A path parameter, percent-encoded (the server's ids use letters, digits and _ - . : @). */
function segment(value: string, what: string): string {
  if (typeof value !== "string" || value === "") throw new TypeError(`${what} must be a non-empty string`);
  return encodeURIComponent(value).replace(/%3A/gi, ":").replace(/%40/g, "@");
}

function toTurn(t: TurnInputLike): TurnInput {
  return { ...t, timestamp: t.timestamp instanceof Date ? t.timestamp.toISOString() : t.timestamp };
}

function json<T extends object>(required: readonly (keyof T & string)[], name: string) {
  return (res: Response, text: string, url: string): T => {
    let data: unknown;
    try {
      data = JSON.parse(text);
    } catch (e) {
      throw new UnexpectedResponseError(`${url}: ${res.status} answer is not JSON: ${String(e)}`, res.status, text);
    }
    if (typeof data !== "object" || data === null || Array.isArray(data)) {
      throw new UnexpectedResponseError(`${url}: answer is not a ${name} object`, res.status, data);
    }
    const missing = required.filter((k) => !(k in data));
    if (missing.length > 0) {
      throw new UnexpectedResponseError(`${url}: answer is not a ${name}: missing ${missing.join(", ")}`, res.status, data);
    }
    return data as T;
  };
}

const text = (_res: Response, body: string) => body;

function pageQuery(options: PageOptions): Record<string, string> | undefined {
  const q: PageQuery = {};
  if (options.limit !== undefined) q.limit = options.limit;
  if (options.cursor) q.cursor = options.cursor;
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(q)) if (v !== undefined) out[k] = String(v);
  return Object.keys(out).length > 0 ? out : undefined;
}

function describe(err: unknown): string {
  const parts: string[] = [];
  let e: unknown = err;
  for (let i = 0; i < 4 && e; i++) {
    const code = (e as { code?: unknown }).code;
    const msg = (e as { message?: unknown }).message;
    parts.push(typeof code === "string" ? `${String(msg)} (${code})` : String(msg ?? e));
    e = (e as { cause?: unknown }).cause;
  }
  return parts.join(": ");
}

function apiError(res: Response, body: string, method: string, url: string): ApiError {
  let parsed: unknown = body;
  try {
    parsed = JSON.parse(body);
  } catch {
    // not JSON: keep the text
  }
  let code = `http_${res.status}`;
  let message = body.trim().slice(0, 500) || res.statusText;
  const detail = (parsed as { error?: { code?: unknown; message?: unknown } } | null)?.error;
  if (detail && typeof detail === "object") {
    if (detail.code !== undefined) code = String(detail.code);
    if (detail.message !== undefined) message = String(detail.message);
  }
  const Cls = errorClassFor(res.status);
  return new Cls({
    status: res.status,
    code,
    message,
    retryAfter: parseRetryAfter(res.headers.get("retry-after")),
    method,
    url,
    body: parsed,
  });
}

/**
 * Client of a Recollect server's HTTP API (fetch-based: Node 20+, Deno, Bun, browsers).
 *
 * ```ts
 * const rc = new RecollectClient({ baseUrl: "http://127.0.0.1:8080", apiKey: "KEY" });
 * await rc.storeTurn("chat-1", { user: "I painted a sunrise over the lake." }, { wait: true });
 * const { memories } = await rc.recall({ query: "What did I paint?", conversation_ids: ["chat-1"], k: 5 });
 * ```
 *
 * Errors are thrown as the classes of `errors.ts`, carrying the server's `code` and `message`.
 */
export class RecollectClient {
  readonly baseUrl: string;
  readonly apiKey: string | undefined;
  readonly timeoutMs: number;
  readonly waitTimeoutMs: number;
  readonly retryPolicy: RetryPolicy;
  private readonly headers: Record<string, string>;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? env("RECOLLECT_URL") ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
    this.apiKey = options.apiKey ?? env("RECOLLECT_API_KEY");
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.waitTimeoutMs = options.waitTimeoutMs ?? 150_000;
    this.retryPolicy = { ...DEFAULT_RETRY, maxRetries: options.maxRetries ?? DEFAULT_RETRY.maxRetries, ...options.retry };
    this.headers = { "user-agent": `recollect-memory-client-typescript/${VERSION}` };
    if (this.apiKey) this.headers["authorization"] = `Bearer ${this.apiKey}`;
    Object.assign(this.headers, options.headers ?? {});
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("no fetch implementation: pass options.fetch");
    this.fetchImpl = f.bind(globalThis);
  }

  // ---- store --------------------------------------------------------------------------------------

  /** `POST /v1/conversations/{id}/turns`: store a batch of turns; one memory id per turn, in order. */
  storeTurns(conversationId: string, turns: readonly TurnInputLike[], options: StoreOptions = {}): Promise<StoreResponse> {
    const items = turns.map(toTurn);
    const body: StoreRequest = { turns: items, ...(options.wait ? { wait: true } : {}) };
    return this.send({
      method: "POST",
      path: `/v1/conversations/${segment(conversationId, "conversationId")}/turns`,
      body,
      // With a turn_id on every turn a repeated store returns the same ids and stores nothing twice.
      idempotent: items.length > 0 && items.every((t) => !!t.turn_id),
      retry: true,
      timeoutMs: options.timeoutMs ?? (options.wait ? this.waitTimeoutMs : undefined),
      signal: options.signal,
      accept: "application/json",
      parse: json<StoreResponse>(["memory_ids"], "StoreResponse"),
    });
  }

  /** Store one turn (`timestamp` defaults to now) and return its memory id. */
  async storeTurn(conversationId: string, turn: NewTurn, options: StoreOptions = {}): Promise<string> {
    const full: TurnInputLike = { ...turn, timestamp: turn.timestamp ?? new Date() };
    const res = await this.storeTurns(conversationId, [full], options);
    return res.memory_ids[0] as string;
  }

  /**
   * Store any number of turns in requests of `batchSize` (the server takes at most
   * `max_turns_per_request`, 1000 by default), in order; returns every memory id. A failing batch
   * throws; the batches before it stay stored (send `turn_id`s to make a rerun safe).
   */
  async storeTurnsBatched(
    conversationId: string,
    turns: Iterable<TurnInputLike>,
    options: StoreOptions & { batchSize?: number } = {},
  ): Promise<string[]> {
    const ids: string[] = [];
    for (const batch of chunked(turns, options.batchSize ?? 500)) {
      ids.push(...(await this.storeTurns(conversationId, batch, options)).memory_ids);
    }
    return ids;
  }

  // ---- query --------------------------------------------------------------------------------------

  /**
   * `POST /v1/recall`: the `k` (1..1000, default 30) memories best matching `query`, best first,
   * each with `score`, `sources` and `score_parts`. A string is taken as the query alone.
   * Filters (`user_ids`, `agent_ids`, `from`, `to`, `speakers`, `metadata`) apply inside every
   * retrieval path, so `k` matching turns come back whenever that many exist.
   */
  recall(request: RecallRequestLike | string, options: CallOptions = {}): Promise<RecallResponse> {
    const r: RecallRequestLike = typeof request === "string" ? { query: request } : request;
    const time = (t: string | Date | null | undefined) => (t instanceof Date ? t.toISOString() : t);
    const body: RecallRequest = {
      ...r,
      now: time(r.now),
      from: time(r.from),
      to: time(r.to),
      as_of: time(r.as_of),
    };
    for (const k of ["now", "from", "to", "as_of"] as const) if (body[k] === undefined) delete body[k];
    return this.send({
      method: "POST",
      path: "/v1/recall",
      body,
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<RecallResponse>(["memories"], "RecallResponse"),
    });
  }

  /** `GET /v1/memories/{id}`: one stored turn, with its `extraction` (keywords, entities,
   * locations, times, references; absent while enrichment is pending) and `fragments`; with
   * `asOf`, the version held at that time. */
  getMemory(memoryId: string, options: CallOptions & { asOf?: string | Date } = {}): Promise<TurnView> {
    const asOf = options.asOf instanceof Date ? options.asOf.toISOString() : options.asOf;
    return this.send({
      method: "GET",
      path: `/v1/memories/${segment(memoryId, "memoryId")}`,
      query: asOf ? { as_of: asOf } : undefined,
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<TurnView>(["conversation_id", "turn_id", "user", "timestamp", "fragments"], "TurnView"),
    });
  }

  /** Several stored turns in the order given, `concurrency` at a time (default 8); a missing one throws NotFoundError. */
  async getMemories(memoryIds: Iterable<string>, options: CallOptions & { concurrency?: number } = {}): Promise<TurnView[]> {
    const ids = [...memoryIds];
    const out: TurnView[] = new Array(ids.length);
    let next = 0;
    const worker = async () => {
      while (next < ids.length) {
        const i = next++;
        out[i] = await this.getMemory(ids[i] as string, options);
      }
    };
    const n = Math.max(1, Math.min(options.concurrency ?? 8, ids.length));
    await Promise.all(Array.from({ length: n }, worker));
    return out;
  }

  /** `GET /v1/conversations/{id}`: stored, pending and recallable turn counts. */
  conversationInfo(conversationId: string, options: CallOptions = {}): Promise<ConversationInfo> {
    return this.send({
      method: "GET",
      path: `/v1/conversations/${segment(conversationId, "conversationId")}`,
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<ConversationInfo>(["conversation_id", "turns", "pending", "recallable"], "ConversationInfo"),
    });
  }

  // ---- listings (cursor-paged) -------------------------------------------------------------------

  /** `GET /v1/conversations`: one page of the tenant's conversation ids, ascending; with
   * `user_id`/`agent_id`, only the conversations with a turn of that end user/agent. */
  listConversations(options: ConversationPageOptions = {}): Promise<ConversationPage> {
    const query = pageQuery(options) ?? {};
    if (options.user_id !== undefined) query.user_id = options.user_id;
    if (options.agent_id !== undefined) query.agent_id = options.agent_id;
    return this.send({
      method: "GET",
      path: "/v1/conversations",
      query: Object.keys(query).length > 0 ? query : undefined,
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<ConversationPage>(["conversations"], "ConversationPage"),
    });
  }

  /** Every conversation id of the tenant, page after page: `for await (const id of rc.iterConversations())`. */
  iterConversations(options: Omit<ConversationPageOptions, "cursor"> = {}): AsyncGenerator<string> {
    return paginateItems(async (cursor) => {
      const page = await this.listConversations({ ...options, cursor });
      return { items: page.conversations, nextCursor: page.next_cursor };
    });
  }

  /** `GET /v1/conversations/{id}/turns`: one page of the conversation's turns in order, each with its extraction. */
  listTurns(conversationId: string, options: PageOptions = {}): Promise<TurnPage> {
    return this.send({
      method: "GET",
      path: `/v1/conversations/${segment(conversationId, "conversationId")}/turns`,
      query: pageQuery(options),
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<TurnPage>(["turns"], "TurnPage"),
    });
  }

  /** Every turn of a conversation in order, page after page (a missing conversation throws NotFoundError). */
  iterTurns(conversationId: string, options: Omit<PageOptions, "cursor"> = {}): AsyncGenerator<TurnView> {
    return paginateItems(async (cursor) => {
      const page = await this.listTurns(conversationId, { ...options, cursor });
      return { items: page.turns, nextCursor: page.next_cursor };
    });
  }

  // ---- erase --------------------------------------------------------------------------------------

  /** `DELETE /v1/conversations/{id}`: erase the conversation from every store. */
  deleteConversation(conversationId: string, options: CallOptions = {}): Promise<Erased> {
    return this.send({
      method: "DELETE",
      path: `/v1/conversations/${segment(conversationId, "conversationId")}`,
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<Erased>(["conversation_id", "turns_erased"], "Erased"),
    });
  }

  /** `PATCH /v1/memories/{id}`: a new version of the turn (`user`, `assistant` (`""` removes it)
   * or `metadata`; at least one); the old one is kept, expired, in its history. Resolves to the
   * version now current (with `wait: true`, once recallable); the same edit again makes none. */
  editMemory(memoryId: string, patch: TurnPatch, options: CallOptions = {}): Promise<Turn> {
    return this.send({
      method: "PATCH",
      path: `/v1/memories/${segment(memoryId, "memoryId")}`,
      body: patch,
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs ?? (patch.wait ? this.waitTimeoutMs : undefined),
      signal: options.signal,
      accept: "application/json",
      parse: json<Turn>(["memory_id", "conversation_id", "user"], "Turn"),
    });
  }

  /** `GET /v1/memories/{id}/history`: every version, oldest first (each replaced one with `expired_at`). */
  memoryHistory(memoryId: string, options: CallOptions = {}): Promise<MemoryHistory> {
    return this.send({
      method: "GET",
      path: `/v1/memories/${segment(memoryId, "memoryId")}/history`,
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<MemoryHistory>(["memory_id", "versions"], "MemoryHistory"),
    });
  }

  /** `POST /v1/reindex`: every turn of the tenant derived again; recall goes on meanwhile. */
  reindex(options: CallOptions = {}): Promise<Reindexing> {
    return this.send({
      method: "POST",
      path: "/v1/reindex",
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<Reindexing>(["conversations", "turns"], "Reindexing"),
    });
  }

  /** `DELETE /v1/memories/{id}`: erase one turn from every store; the rest of its conversation
   * stays recallable. An id this tenant does not have throws NotFoundError. */
  deleteMemory(memoryId: string, options: CallOptions = {}): Promise<MemoryErased> {
    return this.send({
      method: "DELETE",
      path: `/v1/memories/${segment(memoryId, "memoryId")}`,
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<MemoryErased>(["memory_id", "conversation_id", "turn_id"], "MemoryErased"),
    });
  }

  /** `DELETE /v1/tenant?confirm=TENANT`: erase every conversation of the caller's tenant; `confirm` repeats the tenant name. */
  eraseTenant(confirm: string, options: CallOptions = {}): Promise<TenantErased> {
    if (!confirm) throw new TypeError("eraseTenant needs the tenant name your API key maps to");
    const query: paths["/v1/tenant"]["delete"]["parameters"]["query"] = { confirm };
    return this.send({
      method: "DELETE",
      path: "/v1/tenant",
      query,
      idempotent: true,
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: json<TenantErased>(["conversations_erased", "turns_erased"], "TenantErased"),
    });
  }

  // ---- operations ---------------------------------------------------------------------------------

  /** `GET /healthz`: liveness. */
  healthz(options: CallOptions = {}): Promise<string> {
    return this.send({ method: "GET", path: "/healthz", idempotent: true, retry: false, ...options, accept: "text/plain", parse: text });
  }

  /** `GET /readyz`: throws ServiceUnavailableError naming what does not answer when not ready. */
  readyz(options: CallOptions = {}): Promise<string> {
    return this.send({ method: "GET", path: "/readyz", idempotent: true, retry: false, ...options, accept: "text/plain", parse: text });
  }

  /** Whether `/readyz` answers 200 (transport failures count as not ready). */
  async isReady(options: CallOptions = {}): Promise<boolean> {
    try {
      await this.readyz(options);
      return true;
    } catch (e) {
      if (e instanceof ApiError || e instanceof RecollectConnectionError || e instanceof RecollectTimeoutError) return false;
      throw e;
    }
  }

  /** Polls `/readyz` until it answers 200; throws after `timeoutMs`. */
  async waitUntilReady(timeoutMs = 60_000, intervalMs = 100): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!(await this.isReady({ timeoutMs: Math.min(5_000, timeoutMs) }))) {
      if (Date.now() >= deadline) throw new RecollectTimeoutError(`${this.baseUrl} not ready within ${timeoutMs} ms`);
      await sleep(intervalMs / 1000);
    }
  }

  /** `GET /metrics`: the Prometheus text exposition. */
  metrics(options: CallOptions = {}): Promise<string> {
    return this.send({ method: "GET", path: "/metrics", idempotent: true, retry: true, ...options, accept: "text/plain", parse: text });
  }

  /** `GET /openapi.json`: the server's OpenAPI 3.1 document. */
  openapi(options: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.send({
      method: "GET",
      path: "/openapi.json",
      idempotent: true,
      retry: true,
      ...options,
      accept: "application/json",
      parse: json<Record<string, unknown>>(["openapi", "paths"], "OpenAPI document"),
    });
  }

  /** Any request, with this client's auth, retries and typed errors; resolves on 2xx. */
  request(method: string, path: string, options: RawRequestOptions = {}): Promise<RawResponse> {
    const m = method.toUpperCase();
    return this.send({
      method: m,
      path: path.startsWith("/") ? path : `/${path}`,
      body: options.body,
      query: options.query,
      idempotent: options.idempotent ?? ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"].includes(m),
      retry: true,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      accept: "application/json",
      parse: (res, body) => {
        let parsed: unknown = body;
        try {
          parsed = JSON.parse(body);
        } catch {
          // text
        }
        return { status: res.status, headers: res.headers, body: parsed };
      },
    });
  }

  // ---- sending ------------------------------------------------------------------------------------

  private async send<T>(call: Call<T>): Promise<T> {
    const url = this.baseUrl + call.path + (call.query ? `?${new URLSearchParams(call.query).toString()}` : "");
    const headers: Record<string, string> = { ...this.headers, accept: call.accept };
    let payload: string | undefined;
    if (call.body !== undefined) {
      payload = JSON.stringify(call.body);
      headers["content-type"] = "application/json";
    }
    const timeoutMs = call.timeoutMs ?? this.timeoutMs;
    for (let attempt = 0; ; attempt++) {
      const ctrl = new AbortController();
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        ctrl.abort(new RecollectTimeoutError(`${call.method} ${call.path}: timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      const onAbort = () => ctrl.abort(call.signal?.reason);
      call.signal?.addEventListener("abort", onAbort, { once: true });
      let res: Response;
      let body: string;
      try {
        res = await this.fetchImpl(url, { method: call.method, headers, body: payload, signal: ctrl.signal });
        body = await res.text();
      } catch (err) {
        if (call.signal?.aborted) throw call.signal.reason ?? err;
        const wrapped = timedOut
          ? new RecollectTimeoutError(`${call.method} ${call.path}: timed out after ${timeoutMs} ms`, { cause: err })
          : new RecollectConnectionError(`${call.method} ${call.path}: ${describe(err)}`, { cause: err });
        let delay: number | undefined;
        if (call.retry) {
          delay = timedOut
            ? call.idempotent && attempt < this.retryPolicy.maxRetries
              ? backoffDelay(this.retryPolicy, attempt)
              : undefined
            : retryDelayForTransport(this.retryPolicy, attempt, call.idempotent, err);
        }
        if (delay === undefined) throw wrapped;
        await sleep(delay, call.signal);
        continue;
      } finally {
        clearTimeout(timer);
        call.signal?.removeEventListener("abort", onAbort);
      }
      if (res.ok) return call.parse(res, body, url);
      const err = apiError(res, body, call.method, url);
      const delay = call.retry
        ? retryDelayForStatus(this.retryPolicy, attempt, call.idempotent, err.status, err.code, err.retryAfter)
        : undefined;
      if (delay === undefined) throw err;
      await sleep(delay, call.signal);
    }
  }
}
