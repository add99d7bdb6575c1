/**
 * Typed errors. Every error answer of the server is `{"error": {"code", "message"}}`; an
 * {@link ApiError} carries both (`code`, `message`), the HTTP `status` and, for 429/503, the
 * Retry-After delay in seconds (`retryAfter`).
 *
 *     RecollectError
 *     ├── ApiError                      the server answered with an error status
 *     │   ├── BadRequestError           400 (and 405, 415, 422): bad input, names the field
 *     │   │   └── PayloadTooLargeError  413
 *     │   ├── AuthenticationError       401/403
 *     │   ├── NotFoundError             404
 *     │   ├── ConflictError             409: a turn_id already holds a different turn; nothing stored
 *     │   ├── RateLimitError            429 (code "rate_limited")
 *     │   ├── ServiceUnavailableError   503 ("overloaded", not ready, a store failing)
 *     │   └── ServerError               other 5xx
 *     ├── TransportError                no HTTP answer
 *     │   ├── RecollectConnectionError
 *     │   └── RecollectTimeoutError
 *     └── UnexpectedResponseError       a 2xx whose body is not what the API documents
 */

export class RecollectError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

export interface ApiErrorInit {
  status: number;
  code: string;
  message: string;
  retryAfter?: number | undefined;
  method: string;
  url: string;
  body?: unknown;
}

/** The server answered with an error status. `message` is the server's message. */
export class ApiError extends RecollectError {
  readonly status: number;
  /** invalid_argument, unauthenticated, not_found, too_large, rate_limited, overloaded,
   * unavailable, internal; `http_<status>` when the body was not the server's shape. */
  readonly code: string;
  /** Seconds from Retry-After (429/503), else undefined. */
  readonly retryAfter: number | undefined;
  readonly method: string;
  readonly url: string;
  readonly body: unknown;

  constructor(init: ApiErrorInit) {
    super(init.message);
    this.status = init.status;
    this.code = init.code;
    this.retryAfter = init.retryAfter;
    this.method = init.method;
    this.url = init.url;
    this.body = init.body;
  }

  override toString(): string {
    return `${this.name}: ${this.status} ${this.code}: ${this.message} (${this.method} ${this.url})`;
  }
}

export class BadRequestError extends ApiError {}
export class PayloadTooLargeError extends BadRequestError {}
export class AuthenticationError extends ApiError {}
export class NotFoundError extends ApiError {}
/** 409: a `turn_id` of the request already holds a different turn (a retry must repeat it
 * exactly); nothing of the request was stored. Erase the memory first to replace it. */
export class ConflictError extends ApiError {}
export class RateLimitError extends ApiError {}
export class ServiceUnavailableError extends ApiError {}
export class ServerError extends ApiError {}

/** The request got no HTTP answer; `cause` is the underlying error. */
export class TransportError extends RecollectError {}
export class RecollectConnectionError extends TransportError {}
export class RecollectTimeoutError extends TransportError {}

/** A success status whose body is not what the API documents. */
export class UnexpectedResponseError extends RecollectError {
  readonly status: number;
  readonly body: unknown;
  constructor(message: string, status: number, body: unknown) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

const BY_STATUS: Record<number, new (init: ApiErrorInit) => ApiError> = {
  400: BadRequestError,
  405: BadRequestError,
  415: BadRequestError,
  422: BadRequestError,
  413: PayloadTooLargeError,
  401: AuthenticationError,
  403: AuthenticationError,
  404: NotFoundError,
  409: ConflictError,
  429: RateLimitError,
  503: ServiceUnavailableError,
};

/** The error class for an HTTP error status. */
export function errorClassFor(status: number): new (init: ApiErrorInit) => ApiError {
  return BY_STATUS[status] ?? (status >= 500 ? ServerError : ApiError);
}
