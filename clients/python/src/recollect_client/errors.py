"""Typed exceptions. Every error answer of the server is ``{"error": {"code", "message"}}``; an
:class:`APIError` carries both, the HTTP status and, for 429/503, the Retry-After delay.

Hierarchy::

    RecollectError
    ├── APIError                       the server answered with an error status
    │   ├── BadRequestError            400 (and 405, 415, 422): bad input, names the field; nothing stored
    │   │   └── PayloadTooLargeError   413: body over server.max_body_bytes
    │   ├── AuthenticationError        401/403: missing or unknown API key
    │   ├── NotFoundError              404: no such conversation/memory for this tenant
    │   ├── ConflictError              409: a turn_id already holds a different turn; nothing stored
    │   ├── RateLimitError             429: the tenant's token bucket is empty (code "rate_limited")
    │   ├── ServiceUnavailableError    503: in-flight bound ("overloaded"), not ready, or a store failing
    │   └── ServerError                other 5xx
    ├── TransportError                 no HTTP answer
    │   ├── RecollectConnectionError   could not connect / connection dropped
    │   └── RecollectTimeoutError      the timeout passed
    └── UnexpectedResponseError        a 2xx whose body does not match the API's schema
"""

from __future__ import annotations

from typing import Any


class RecollectError(Exception):
    """Base class of every error this client raises."""


class APIError(RecollectError):
    """The server answered with an error status.

    Attributes:
        status: the HTTP status code.
        code: the server's error code (``invalid_argument``, ``unauthenticated``, ``not_found``,
            ``too_large``, ``rate_limited``, ``overloaded``, ``unavailable``, ``internal``; or
            ``http_<status>`` when the body was not the server's error shape, e.g. from a proxy).
        message: the server's message (names the offending field for bad input).
        retry_after: seconds from the Retry-After header (429/503), else ``None``.
        method, url: the request that failed.
        body: the decoded JSON body, or the text when it was not JSON.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retry_after: float | None = None,
        method: str = "",
        url: str = "",
        body: Any = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.method = method
        self.url = url
        self.body = body
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f" ({self.method} {self.url})" if self.method else ""
        return f"{self.status} {self.code}: {self.message}{where}"

    def __reduce__(self):  # keep pickling (multiprocessing, task queues) working
        return (
            _rebuild_api_error,
            (type(self), self.status, self.code, self.message, self.retry_after, self.method, self.url, self.body),
        )


def _rebuild_api_error(cls, status, code, message, retry_after, method, url, body):
    return cls(status, code, message, retry_after=retry_after, method=method, url=url, body=body)


class BadRequestError(APIError):
    """400 (also 405, 415, 422): the request is malformed or breaks a limit. Do not retry."""


class PayloadTooLargeError(BadRequestError):
    """413: the body is over the server's ``max_body_bytes``."""


class AuthenticationError(APIError):
    """401/403: missing or unknown API key."""


class NotFoundError(APIError):
    """404: no such conversation or memory for this tenant (another tenant's data answers the same)."""


class ConflictError(APIError):
    """409: a ``turn_id`` of the request already holds a different turn (a retry must repeat the
    turn exactly); nothing of the request was stored. Erase the memory first to replace it."""


class RateLimitError(APIError):
    """429: the tenant's rate limit; ``retry_after`` says when a token is back."""


class ServiceUnavailableError(APIError):
    """503: the server is at its in-flight bound (code ``overloaded``), not ready, a store is
    failing, or (storing with ``wait``) enrichment did not finish in time: the turns are stored."""


class ServerError(APIError):
    """Any other 5xx."""


class TransportError(RecollectError):
    """The request got no HTTP answer; ``__cause__`` is the underlying httpx exception."""


class RecollectConnectionError(TransportError):
    """Could not connect, or the connection broke before an answer."""


class RecollectTimeoutError(TransportError):
    """The timeout passed before the answer arrived."""


class UnexpectedResponseError(RecollectError):
    """A success status whose body is not what the API documents (not JSON, or not the schema)."""

    def __init__(self, message: str, *, status: int, body: Any = None) -> None:
        self.status = status
        self.body = body
        super().__init__(message)


_BY_STATUS: dict[int, type[APIError]] = {
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
}


def error_class_for(status: int) -> type[APIError]:
    """The exception class for an error status."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return ServerError
    return APIError


__all__ = [
    "RecollectError",
    "APIError",
    "BadRequestError",
    "PayloadTooLargeError",
    "AuthenticationError",
    "NotFoundError",
    "ConflictError",
    "RateLimitError",
    "ServiceUnavailableError",
    "ServerError",
    "TransportError",
    "RecollectConnectionError",
    "RecollectTimeoutError",
    "UnexpectedResponseError",
    "error_class_for",
]
