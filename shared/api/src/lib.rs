//! Plumbing shared by the services that speak HTTP and gRPC: the one place errors become HTTP
//! status codes and gRPC statuses, the tenant taken from the credential, and JSON bodies whose
//! rejections say what is wrong.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use recollect_model::{Classify, ErrorKind, RecollectError, TenantId};
use serde::de::DeserializeOwned;

pub mod limits;
pub use limits::{guard, Guard, RateLimiter, Shed};

/// An error as the HTTP edge returns it: `{"error": {"code", "message"}}` with the status for its kind.
#[derive(Debug)]
pub struct ApiError(pub RecollectError);

impl<E: Into<RecollectError>> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError(e.into())
    }
}

/// The single mapping from error kind to HTTP status.
pub fn status_for(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The single mapping from error kind to gRPC status code (the gRPC twin of [`status_for`]).
pub fn grpc_code_for(kind: ErrorKind) -> tonic::Code {
    match kind {
        ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::Conflict => tonic::Code::AlreadyExists,
        ErrorKind::ResourceExhausted => tonic::Code::ResourceExhausted,
        ErrorKind::Unavailable => tonic::Code::Unavailable,
        ErrorKind::Internal => tonic::Code::Internal,
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let kind = e.0.kind();
        if kind == ErrorKind::Internal || kind == ErrorKind::Unavailable {
            tracing::error!(error = %e.0, code = kind.code(), "grpc request failed");
        }
        let mut status = tonic::Status::new(grpc_code_for(kind), e.0.to_string());
        if matches!(kind, ErrorKind::ResourceExhausted | ErrorKind::Unavailable) {
            // The same hint as HTTP's Retry-After.
            status.metadata_mut().insert(
                "retry-after",
                tonic::metadata::MetadataValue::from_static("1"),
            );
        }
        status
    }
}

/// A service-layer error as a gRPC status, through the one mapping.
pub fn grpc_status(e: impl Into<RecollectError>) -> tonic::Status {
    ApiError(e.into()).into()
}

/// Every HTTP error body: `{"error": {"code", "message"}}`.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// invalid_argument, unauthenticated, not_found, too_large, resource_exhausted, unavailable, internal
    pub code: String,
    /// What is wrong, naming the field.
    pub message: String,
}

pub fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            code: code.to_string(),
            message: message.to_string(),
        },
    };
    let mut r = (status, axum::Json(body)).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = self.0.kind();
        if kind == ErrorKind::Internal || kind == ErrorKind::Unavailable {
            tracing::error!(error = %self.0, code = kind.code(), "request failed");
        }
        error_response(status_for(kind), kind.code(), &self.0.to_string())
    }
}

/// API keys → tenants. Empty: open, single-tenant mode (loopback only; checked at start).
#[derive(Debug, Clone, Default)]
pub struct Auth {
    keys: Arc<HashMap<String, TenantId>>,
}

impl Auth {
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Self {
            keys: Arc::new(pairs.into_iter().map(|(k, t)| (k, TenantId(t))).collect()),
        }
    }

    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    /// The tenant for an `Authorization` header value; the credential is the only source.
    pub fn tenant_for(&self, authorization: Option<&str>) -> Result<TenantId, RecollectError> {
        if self.is_open() {
            return Ok(TenantId::default_tenant());
        }
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                RecollectError::Unauthenticated("missing Authorization: Bearer <api key>".into())
            })?;
        self.keys
            .get(token)
            .cloned()
            .ok_or_else(|| RecollectError::Unauthenticated("unknown API key".into()))
    }
}

impl Auth {
    /// The tenant for a gRPC call, from its `authorization` metadata (same keys as HTTP).
    pub fn tenant_for_grpc(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<TenantId, tonic::Status> {
        let h = metadata.get("authorization").and_then(|v| v.to_str().ok());
        self.tenant_for(h).map_err(grpc_status)
    }
}

/// Anything that can hand out the [`Auth`] table.
pub trait HasAuth {
    fn auth(&self) -> &Auth;
}

/// The caller's tenant, from the credential.
pub struct Tenant(pub TenantId);

impl<S: HasAuth + Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let h = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        Ok(Tenant(state.auth().tenant_for(h)?))
    }
}

/// One path segment as a string; undecodable segments (bad percent-encoding, invalid UTF-8)
/// become our 400 body instead of axum's plain-text rejection.
pub struct PathParam(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathParam {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<String>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(PathParam(v)),
            Err(rej) => Err(error_response(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                &format!("invalid path parameter: {}", rej.body_text()),
            )),
        }
    }
}

/// For `Router::method_not_allowed_fallback`: a 405 in the shared error shape.
pub async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}

/// `axum::Json` whose rejections become our 400/413/415 bodies, naming the problem.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(rej) => {
                // Wrong types and unknown fields are bad input like any other: 400, not axum's 422.
                let status = match &rej {
                    JsonRejection::JsonDataError(_) => StatusCode::BAD_REQUEST,
                    other => other.status(),
                };
                let message = match &rej {
                    JsonRejection::JsonDataError(e) => {
                        format!("invalid request body: {}", e.body_text())
                    }
                    JsonRejection::JsonSyntaxError(e) => {
                        format!("malformed JSON: {}", e.body_text())
                    }
                    JsonRejection::MissingJsonContentType(_) => {
                        "expected Content-Type: application/json".to_string()
                    }
                    other => other.body_text(),
                };
                let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    "too_large"
                } else {
                    "invalid_argument"
                };
                Err(error_response(status, code, &message))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_comes_from_the_key_only() {
        let a = Auth::new(vec![("k1".into(), "ta".into()), ("k2".into(), "tb".into())]);
        assert_eq!(
            a.tenant_for(Some("Bearer k1")).unwrap(),
            TenantId("ta".into())
        );
        assert_eq!(
            a.tenant_for(Some("Bearer k2")).unwrap(),
            TenantId("tb".into())
        );
        assert!(a.tenant_for(Some("Bearer nope")).is_err());
        assert!(a.tenant_for(None).is_err());
        assert!(a.tenant_for(Some("k1")).is_err());
        let open = Auth::default();
        assert_eq!(open.tenant_for(None).unwrap(), TenantId::default_tenant());
    }

    #[test]
    fn kinds_map_to_statuses() {
        assert_eq!(
            status_for(ErrorKind::InvalidArgument),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(status_for(ErrorKind::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(
            status_for(ErrorKind::Unauthenticated),
            StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn kinds_map_to_grpc_codes_with_the_message() {
        let s = grpc_status(RecollectError::invalid("turns[0].user is empty"));
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert_eq!(s.message(), "turns[0].user is empty");
        assert_eq!(
            grpc_status(RecollectError::NotFound("x".into())).code(),
            tonic::Code::NotFound
        );
        let busy = grpc_status(RecollectError::Exhausted("slow down".into()));
        assert_eq!(busy.code(), tonic::Code::ResourceExhausted);
        assert_eq!(busy.metadata().get("retry-after").unwrap(), "1");
        let auth = Auth::new(vec![("k1".into(), "ta".into())]);
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(
            auth.tenant_for_grpc(&md).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        md.insert("authorization", "Bearer k1".parse().unwrap());
        assert_eq!(auth.tenant_for_grpc(&md).unwrap(), TenantId("ta".into()));
    }
}
