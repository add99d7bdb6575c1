/**
 * When and how long to wait before trying a request again (the same policy as the Python client).
 *
 * Retried: 429 (refused before any work, so always safe) and 503 `overloaded` (the same),
 * honouring Retry-After; other 503s and 502/504 only for idempotent requests; connection failures
 * before the request was sent always, other transport failures (timeouts, dropped connections)
 * only for idempotent requests. Reads, recall and deletes are idempotent; a store is idempotent
 * when every turn carries a `turn_id` (the server then returns the same ids and stores nothing
 * twice).
 */
export interface RetryPolicy {
  /** Retries after the first attempt (0: none). Default 3. */
  maxRetries: number;
  /** The longest Retry-After honoured, in seconds; a longer one throws at once. Default 30. */
  maxRetryAfter: number;
  /** First delay in seconds when the server gives no Retry-After; doubled per retry, jittered. Default 0.5. */
  backoff: number;
  /** Cap of that delay, seconds. Default 8. */
  maxBackoff: number;
}

export const DEFAULT_RETRY: RetryPolicy = { maxRetries: 3, maxRetryAfter: 30, backoff: 0.5, maxBackoff: 8 };

export function backoffDelay(policy: RetryPolicy, attempt: number): number {
  const base = Math.min(policy.maxBackoff, policy.backoff * 2 ** attempt);
  return base * (0.5 + Math.random() / 2);
}

/** Retry-After as seconds: delta-seconds or an HTTP date; undefined when absent or unparsable. */
export function parseRetryAfter(value: string | null | undefined, now: number = Date.now()): number | undefined {
  if (value === null || value === undefined) return undefined;
  const v = value.trim();
  if (v === "") return undefined;
  if (/^-?\d+(\.\d+)?$/.test(v)) return Math.max(0, Number(v));
  const when = Date.parse(v);
  if (Number.isNaN(when)) return undefined;
  return Math.max(0, (when - now) / 1000);
}

/** Seconds to wait before retrying an error answer, or undefined to give up. */
export function retryDelayForStatus(
  policy: RetryPolicy,
  attempt: number,
  idempotent: boolean,
  status: number,
  code: string,
  retryAfter: number | undefined,
): number | undefined {
  if (attempt >= policy.maxRetries) return undefined;
  const refusedBeforeWork = status === 429 || (status === 503 && code === "overloaded");
  if (!(refusedBeforeWork || (idempotent && (status === 502 || status === 503 || status === 504)))) return undefined;
  if (retryAfter === undefined) return backoffDelay(policy, attempt);
  if (retryAfter > policy.maxRetryAfter) return undefined;
  return retryAfter;
}

// Errors of undici (Node's fetch) raised before anything was sent.
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT", "EHOSTUNREACH", "ENETUNREACH"]);

/** Whether a fetch failure happened before the request reached the server. */
export function notSent(err: unknown): boolean {
  let e: unknown = err;
  for (let depth = 0; depth < 4 && e && typeof e === "object"; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && NOT_SENT.has(code)) return true;
    const errors = (e as { errors?: unknown }).errors; // AggregateError (happy eyeballs)
    if (Array.isArray(errors) && errors.length > 0 && errors.every((x) => notSent(x))) return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** Seconds to wait before retrying a transport failure, or undefined to give up. */
export function retryDelayForTransport(
  policy: RetryPolicy,
  attempt: number,
  idempotent: boolean,
  err: unknown,
): number | undefined {
  if (attempt >= policy.maxRetries) return undefined;
  if (notSent(err) || idempotent) return backoffDelay(policy, attempt);
  return undefined;
}

export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, seconds * 1000);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
