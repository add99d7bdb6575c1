"""Python client for Recollect, long-term memory for LLM agents.

    from recollect_client import Client

    with Client("http://127.0.0.1:8080", api_key="KEY") as rc:
        rc.store_turn("chat-1", "I painted a sunrise over the lake.", "Lovely!", wait=True)
        for m in rc.recall("What did I paint?", conversation_ids=["chat-1"], k=5).memories:
            print(m.score, m.user)

:class:`Client` (sync) and :class:`AsyncClient` (async) cover the whole HTTP API; the models are
generated from the server's OpenAPI document (:mod:`recollect_client.models`); errors are the
typed exceptions of :mod:`recollect_client.errors`. Integrations (optional extras):
:mod:`recollect_client.integrations.langchain` and :mod:`recollect_client.integrations.llama_index`.
"""

from . import errors, models
from ._base import RetryPolicy, parse_retry_after
from ._version import __version__
from .async_client import AsyncClient
from .client import Client
from .errors import (
    APIError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    RecollectConnectionError,
    RecollectError,
    RecollectTimeoutError,
    ServerError,
    ServiceUnavailableError,
    TransportError,
    UnexpectedResponseError,
)
from .models import (
    ConversationInfo,
    ConversationPage,
    Erased,
    Extraction,
    MemoryErased,
    MemoryHistory,
    Reindexing,
    TurnPatch,
    RecalledMemory,
    RecallResponse,
    ReferenceState,
    ScoreParts,
    StoreResponse,
    TenantErased,
    Turn,
    TurnInput,
    TurnPage,
    TurnView,
)
from .pagination import Page, aiter_items, aiter_pages, iter_items, iter_pages

__all__ = [
    "__version__",
    "Client",
    "AsyncClient",
    "RetryPolicy",
    "parse_retry_after",
    "errors",
    "models",
    "APIError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "RecollectConnectionError",
    "RecollectError",
    "RecollectTimeoutError",
    "ServerError",
    "ServiceUnavailableError",
    "TransportError",
    "UnexpectedResponseError",
    "ConversationInfo",
    "ConversationPage",
    "Erased",
    "Extraction",
    "MemoryErased",
    "MemoryHistory",
    "Reindexing",
    "TurnPatch",
    "RecalledMemory",
    "RecallResponse",
    "ReferenceState",
    "ScoreParts",
    "StoreResponse",
    "TenantErased",
    "Turn",
    "TurnInput",
    "TurnPage",
    "TurnView",
    "Page",
    "iter_pages",
    "iter_items",
    "aiter_pages",
    "aiter_items",
]
