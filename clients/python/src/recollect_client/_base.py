"""What the sync and async clients share: building each call of the HTTP API, the retry policy,
and turning answers into models or typed exceptions. Only the sending differs between them."""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import pydantic

from . import errors
from ._version import __version__
from .models import (
    ConversationInfo,
    ConversationPage,
    Erased,
    MemoryErased,
    MemoryHistory,
    RecallRequest,
    RecallResponse,
    ReferenceState,
    Reindexing,
    StoreRequest,
    StoreResponse,
    TenantErased,
    Turn,
    TurnInput,
    TurnPage,
    TurnPatch,
    TurnView,
)

log = logging.getLogger("recollect_client")

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 30.0
# The server holds a `wait: true` store until the turns are recallable, up to its
# server.wait_timeout_secs (120 s by default): such requests get this read timeout instead.
DEFAULT_WAIT_TIMEOUT = 150.0

T = TypeVar("T")
TurnLike = TurnInput | Mapping[str, Any]


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before trying a request again.

    Retried: 429 (refused before any work, so always safe) and 503 ``overloaded`` (the same),
    honouring Retry-After; other 503s and 502/504 only for idempotent requests; connection
    failures before the request was sent always, other transport failures (read timeouts, dropped
    connections) only for idempotent requests. Reads, recall and deletes are idempotent; a store
    is idempotent when every turn carries a ``turn_id`` (the server then returns the same ids and
    stores nothing twice), otherwise a store whose answer was lost is not repeated.

    Attributes:
        max_retries: retries after the first attempt (0: none).
        max_retry_after: the longest Retry-After honoured; a longer one raises at once (the
            exception carries ``retry_after``).
        backoff: first delay when the server gives no Retry-After; doubled per retry, with
            jitter, up to ``max_backoff``.
    """

    max_retries: int = 3
    max_retry_after: float = 30.0
    backoff: float = 0.5
    max_backoff: float = 8.0

    def backoff_delay(self, attempt: int) -> float:
        base = min(self.max_backoff, self.backoff * (2**attempt))
        return base * (0.5 + random.random() / 2)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date. ``None`` when absent or unparsable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass
class Call(Generic[T]):
    """One API call: the request and how to read its success answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str] | None = None
    idempotent: bool = True
    retry: bool = True
    timeout: float | httpx.Timeout | None = None
    accept: str = "application/json"


def segment(value: str, what: str) -> str:
    """A path parameter, percent-encoded (the server's ids use letters, digits and _ - . : @)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return quote(value, safe="-._~:@")


def model_parser(model: type[pydantic.BaseModel]) -> Callable[[httpx.Response], Any]:
    def parse(resp: httpx.Response) -> Any:
        try:
            data = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise errors.UnexpectedResponseError(
                f"{resp.request.method} {resp.request.url}: {resp.status_code} answer is not JSON: {e}",
                status=resp.status_code,
                body=resp.text,
            ) from e
        try:
            return model.model_validate(data)
        except pydantic.ValidationError as e:
            raise errors.UnexpectedResponseError(
                f"{resp.request.method} {resp.request.url}: answer does not match {model.__name__}: {e}",
                status=resp.status_code,
                body=data,
            ) from e

    return parse


def text_parser(resp: httpx.Response) -> str:
    return resp.text


def json_parser(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise errors.UnexpectedResponseError(
            f"{resp.request.method} {resp.request.url}: answer is not JSON: {e}",
            status=resp.status_code,
            body=resp.text,
        ) from e


def raw_parser(resp: httpx.Response) -> httpx.Response:
    return resp


def api_error(resp: httpx.Response) -> errors.APIError:
    """The typed exception for an error answer, with the server's code and message."""
    status = resp.status_code
    body: Any
    try:
        body = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = resp.text
    code, message = f"http_{status}", (resp.text.strip()[:500] or resp.reason_phrase)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        detail = body["error"]
        code = str(detail.get("code", code))
        message = str(detail.get("message", message))
    cls = errors.error_class_for(status)
    return cls(
        status,
        code,
        message,
        retry_after=parse_retry_after(resp.headers.get("retry-after")),
        method=resp.request.method,
        url=str(resp.request.url),
        body=body,
    )


# Transport failures where the request surely never reached the server: safe to repeat for any call.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def transport_error(exc: httpx.TransportError, call: Call) -> errors.TransportError:
    what = f"{call.method} {call.path}"
    if isinstance(exc, httpx.TimeoutException):
        return errors.RecollectTimeoutError(f"{what}: timed out ({type(exc).__name__}: {exc})")
    return errors.RecollectConnectionError(f"{what}: {type(exc).__name__}: {exc}")


def retry_delay(
    policy: RetryPolicy,
    call: Call,
    attempt: int,
    *,
    error: errors.APIError | None = None,
    exc: httpx.TransportError | None = None,
) -> float | None:
    """Seconds to wait before attempt ``attempt + 1``, or ``None`` to give up and raise."""
    if not call.retry or attempt >= policy.max_retries:
        return None
    if exc is not None:
        if isinstance(exc, _NOT_SENT) or call.idempotent:
            return policy.backoff_delay(attempt)
        return None
    assert error is not None
    refused_before_work = error.status == 429 or (error.status == 503 and error.code == "overloaded")
    if refused_before_work or (call.idempotent and error.status in (502, 503, 504)):
        if error.retry_after is None:
            return policy.backoff_delay(attempt)
        if error.retry_after > policy.max_retry_after:
            return None
        return error.retry_after
    return None


def page_params(limit: int | None, cursor: str | None) -> dict[str, str] | None:
    """The query of a listing: ``limit`` (1..500 on the server, default 50) and ``cursor``."""
    params = {}
    if limit is not None:
        params["limit"] = str(limit)
    if cursor:
        params["cursor"] = cursor
    return params or None


def to_turn(t: TurnLike) -> TurnInput:
    return t if isinstance(t, TurnInput) else TurnInput.model_validate(dict(t))


def chunks(items: Iterable[T], size: int) -> Iterable[list[T]]:
    if size < 1:
        raise ValueError(f"batch size must be at least 1, got {size}")
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class BaseClient:
    """Configuration and the call builders; see :class:`recollect_client.Client`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        max_retries: int = 3,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("RECOLLECT_URL") or DEFAULT_BASE_URL).rstrip("/")
        if api_key is None:
            api_key = os.environ.get("RECOLLECT_API_KEY") or None
        self.api_key = api_key
        self.timeout = timeout
        self.wait_timeout = wait_timeout
        self.retry_policy = retry or RetryPolicy(max_retries=max_retries)
        self._headers = {"user-agent": f"recollect-memory-client-python/{__version__} httpx/{httpx.__version__}"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._headers.update(headers or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, api_key={'***' if self.api_key else None})"

    # ---- call builders: one per operation of /openapi.json -------------------------------------

    def _store_turns_call(
        self, conversation_id: str, turns: Sequence[TurnLike], wait: bool, timeout: float | None
    ) -> Call[StoreResponse]:
        items = [to_turn(t) for t in turns]
        body = StoreRequest(turns=items, wait=wait or None)
        return Call(
            "POST",
            f"/v1/conversations/{segment(conversation_id, 'conversation_id')}/turns",
            model_parser(StoreResponse),
            json=body.model_dump(mode="json", exclude_none=True),
            # With a turn_id on every turn a repeated store returns the same ids and stores nothing twice.
            idempotent=bool(items) and all(t.turn_id for t in items),
            timeout=timeout if timeout is not None else (self.wait_timeout if wait else None),
        )

    def _recall_call(
        self,
        query: str,
        conversation_ids: Sequence[str] | None,
        k: int | None,
        attention_state: ReferenceState | Mapping[str, Any] | None,
        now: datetime | str | None,
        timeout: float | None,
        *,
        user_ids: Sequence[str] | None = None,
        agent_ids: Sequence[str] | None = None,
        from_: datetime | str | None = None,
        to: datetime | str | None = None,
        speakers: Sequence[str] | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
        as_of: datetime | str | None = None,
    ) -> Call[RecallResponse]:
        def listed(v: Sequence[str] | None) -> list[str] | None:
            return list(v) if v is not None else None

        body = RecallRequest.model_validate(
            {
                "query": query,
                "conversation_ids": listed(conversation_ids),
                "k": k,
                "attention_state": attention_state,
                "now": now,
                "user_ids": listed(user_ids),
                "agent_ids": listed(agent_ids),
                "from": from_,
                "to": to,
                "speakers": listed(speakers),
                "metadata": dict(metadata) if metadata is not None else None,
                "as_of": as_of,
            }
        )
        return Call(
            "POST",
            "/v1/recall",
            model_parser(RecallResponse),
            json=body.model_dump(mode="json", exclude_none=True, by_alias=True),
            idempotent=True,
            timeout=timeout,
        )

    def _get_memory_call(
        self, memory_id: str, timeout: float | None, as_of: datetime | str | None = None
    ) -> Call[TurnView]:
        params = {"as_of": as_of.isoformat() if isinstance(as_of, datetime) else as_of} if as_of else None
        return Call(
            "GET",
            f"/v1/memories/{segment(memory_id, 'memory_id')}",
            model_parser(TurnView),
            params=params,
            timeout=timeout,
        )

    def _edit_memory_call(
        self,
        memory_id: str,
        user: str | None,
        assistant: str | None,
        metadata: Mapping[str, Any] | None,
        wait: bool,
        timeout: float | None,
    ) -> Call[Turn]:
        body = TurnPatch(
            user=user,
            assistant=assistant,
            metadata=dict(metadata) if metadata is not None else None,
            wait=wait or None,
        )
        return Call(
            "PATCH",
            f"/v1/memories/{segment(memory_id, 'memory_id')}",
            model_parser(Turn),
            json=body.model_dump(mode="json", exclude_none=True),
            # The same edit again makes no new version: safe to repeat.
            idempotent=True,
            timeout=timeout if timeout is not None else (self.wait_timeout if wait else None),
        )

    def _memory_history_call(self, memory_id: str, timeout: float | None) -> Call[MemoryHistory]:
        return Call(
            "GET",
            f"/v1/memories/{segment(memory_id, 'memory_id')}/history",
            model_parser(MemoryHistory),
            timeout=timeout,
        )

    def _reindex_call(self, timeout: float | None) -> Call[Reindexing]:
        return Call("POST", "/v1/reindex", model_parser(Reindexing), idempotent=True, timeout=timeout)

    def _list_conversations_call(
        self,
        limit: int | None,
        cursor: str | None,
        timeout: float | None,
        user_id: str | None = None,
        agent_id: str | None = None,
    ) -> Call[ConversationPage]:
        params = page_params(limit, cursor) or {}
        if user_id is not None:
            params["user_id"] = user_id
        if agent_id is not None:
            params["agent_id"] = agent_id
        return Call(
            "GET", "/v1/conversations", model_parser(ConversationPage), params=params or None, timeout=timeout
        )

    def _list_turns_call(
        self, conversation_id: str, limit: int | None, cursor: str | None, timeout: float | None
    ) -> Call[TurnPage]:
        return Call(
            "GET",
            f"/v1/conversations/{segment(conversation_id, 'conversation_id')}/turns",
            model_parser(TurnPage),
            params=page_params(limit, cursor),
            timeout=timeout,
        )

    def _conversation_info_call(self, conversation_id: str, timeout: float | None) -> Call[ConversationInfo]:
        return Call(
            "GET",
            f"/v1/conversations/{segment(conversation_id, 'conversation_id')}",
            model_parser(ConversationInfo),
            timeout=timeout,
        )

    def _delete_conversation_call(self, conversation_id: str, timeout: float | None) -> Call[Erased]:
        return Call(
            "DELETE",
            f"/v1/conversations/{segment(conversation_id, 'conversation_id')}",
            model_parser(Erased),
            timeout=timeout,
        )

    def _delete_memory_call(self, memory_id: str, timeout: float | None) -> Call[MemoryErased]:
        return Call(
            "DELETE",
            f"/v1/memories/{segment(memory_id, 'memory_id')}",
            model_parser(MemoryErased),
            timeout=timeout,
        )

    def _erase_tenant_call(self, confirm: str, timeout: float | None) -> Call[TenantErased]:
        if not confirm:
            raise ValueError("erase_tenant needs confirm=<the tenant name your API key maps to>")
        return Call("DELETE", "/v1/tenant", model_parser(TenantErased), params={"confirm": confirm}, timeout=timeout)

    def _healthz_call(self, timeout: float | None) -> Call[str]:
        return Call("GET", "/healthz", text_parser, retry=False, timeout=timeout, accept="text/plain")

    def _readyz_call(self, timeout: float | None) -> Call[str]:
        return Call("GET", "/readyz", text_parser, retry=False, timeout=timeout, accept="text/plain")

    def _metrics_call(self, timeout: float | None) -> Call[str]:
        return Call("GET", "/metrics", text_parser, timeout=timeout, accept="text/plain")

    def _openapi_call(self, timeout: float | None) -> Call[dict]:
        return Call("GET", "/openapi.json", json_parser, timeout=timeout)

    def _raw_call(
        self,
        method: str,
        path: str,
        json_body: Any,
        params: Mapping[str, str] | None,
        idempotent: bool | None,
        timeout: float | None,
    ) -> Call[httpx.Response]:
        method = method.upper()
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "OPTIONS", "PUT", "DELETE")
        if not path.startswith("/"):
            path = "/" + path
        return Call(method, path, raw_parser, json=json_body, params=params, idempotent=idempotent, timeout=timeout)

    # ---- sending helpers -------------------------------------------------------------------------

    def _build(self, http: httpx.Client | httpx.AsyncClient, call: Call) -> httpx.Request:
        headers = dict(self._headers)
        headers["accept"] = call.accept
        return http.build_request(
            call.method,
            self.base_url + call.path,
            json=call.json,
            params=call.params,
            headers=headers,
            timeout=call.timeout if call.timeout is not None else self.timeout,
        )

    def _outcome(self, call: Call, resp: httpx.Response, attempt: int) -> tuple[Any, float | None, Exception | None]:
        """(result, None, None) on success; (None, delay, error) to retry; raises to give up."""
        if resp.is_success:
            return call.parse(resp), None, None
        err = api_error(resp)
        delay = retry_delay(self.retry_policy, call, attempt, error=err)
        if delay is None:
            raise err
        log.info("retrying %s %s in %.2fs after %s (attempt %d)", call.method, call.path, delay, err.status, attempt + 1)
        return None, delay, err

    def _transport_outcome(self, call: Call, exc: httpx.TransportError, attempt: int) -> float:
        delay = retry_delay(self.retry_policy, call, attempt, exc=exc)
        if delay is None:
            raise transport_error(exc, call) from exc
        log.info("retrying %s %s in %.2fs after %s (attempt %d)", call.method, call.path, delay, type(exc).__name__, attempt + 1)
        return delay


def utc_now() -> datetime:
    return datetime.now(timezone.utc)
