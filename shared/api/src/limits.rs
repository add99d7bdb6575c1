//! Load limits at the HTTP edge: a token bucket per tenant (429 with Retry-After) and a bound on
//! requests in flight (503 with Retry-After), so overload is refused early instead of queued.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use recollect_model::TenantId;
use recollect_telemetry::events::{InternalEvent, RequestShed, ShedReason};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{error_response, ApiError, Auth};

/// Per-tenant token buckets, at most `max_tenants` of them.
pub struct RateLimiter {
    per_sec: f64,
    burst: f64,
    max_tenants: usize,
    buckets: Mutex<HashMap<TenantId, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// `per_sec` below 1 is taken as 1 (the [`Guard`] turns the limit off for 0).
    pub fn new(per_sec: u32, burst: u32, max_tenants: usize) -> Self {
        Self {
            per_sec: f64::from(per_sec.max(1)),
            burst: f64::from(burst.max(1)),
            max_tenants: max_tenants.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token for `tenant` at `now`; `Err(wait)` when the bucket is empty.
    pub fn check_at(&self, tenant: &TenantId, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock();
        if !buckets.contains_key(tenant) && buckets.len() >= self.max_tenants {
            self.evict(&mut buckets, now);
        }
        let b = buckets.entry(tenant.clone()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.per_sec).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.per_sec))
        }
    }

    pub fn check(&self, tenant: &TenantId) -> Result<(), Duration> {
        self.check_at(tenant, Instant::now())
    }

    /// Drops buckets that have refilled (forgetting them changes nothing); if none has, the one
    /// idle longest, so the map stays bounded whatever the number of tenants.
    fn evict(&self, buckets: &mut HashMap<TenantId, Bucket>, now: Instant) {
        let full_after = Duration::from_secs_f64(self.burst / self.per_sec);
        buckets.retain(|_, b| now.saturating_duration_since(b.at) < full_after);
        if buckets.len() >= self.max_tenants {
            if let Some(oldest) = buckets
                .iter()
                .min_by_key(|(_, b)| b.at)
                .map(|(t, _)| t.clone())
            {
                buckets.remove(&oldest);
            }
        }
    }

    pub fn tracked_tenants(&self) -> usize {
        self.buckets.lock().len()
    }
}

/// What the [`guard`] middleware needs: who the caller is, their bucket, the in-flight bound.
pub struct Guard {
    auth: Auth,
    rate: Option<RateLimiter>,
    in_flight: Arc<Semaphore>,
}

impl Guard {
    /// `per_sec == 0` turns the rate limit off.
    pub fn new(
        auth: Auth,
        per_sec: u32,
        burst: u32,
        max_tenants: usize,
        max_in_flight: usize,
    ) -> Self {
        Self {
            auth,
            rate: (per_sec > 0).then(|| RateLimiter::new(per_sec, burst, max_tenants)),
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
        }
    }
}

/// 429/503 in the shared error shape, with a Retry-After of whole seconds (at least 1).
pub fn shed_response(
    status: StatusCode,
    code: &str,
    message: &str,
    retry_after: Duration,
) -> Response {
    let mut r = error_response(status, code, message);
    let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_str(&secs.to_string()).expect("digits are a valid header"),
    );
    r
}

/// Why a request was refused before any work: the tenant's bucket is empty (retry after the
/// wait) or the in-flight bound is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    RateLimited(Duration),
    Overloaded,
}

impl Shed {
    pub const RATE_LIMITED_MESSAGE: &'static str =
        "too many requests for this tenant; retry after the Retry-After delay";
    pub const OVERLOADED_MESSAGE: &'static str =
        "the server is at its in-flight request limit; retry after the Retry-After delay";

    /// The HTTP answer: 429 or 503 with Retry-After, in the shared error shape.
    pub fn response(self) -> Response {
        match self {
            Shed::RateLimited(wait) => shed_response(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                Self::RATE_LIMITED_MESSAGE,
                wait,
            ),
            Shed::Overloaded => shed_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                Self::OVERLOADED_MESSAGE,
                Duration::from_secs(1),
            ),
        }
    }

    /// The gRPC answer: RESOURCE_EXHAUSTED or UNAVAILABLE with the same retry-after hint.
    pub fn status(self) -> tonic::Status {
        let (mut status, wait) = match self {
            Shed::RateLimited(wait) => (
                tonic::Status::resource_exhausted(Self::RATE_LIMITED_MESSAGE),
                wait,
            ),
            Shed::Overloaded => (
                tonic::Status::unavailable(Self::OVERLOADED_MESSAGE),
                Duration::from_secs(1),
            ),
        };
        let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
        status.metadata_mut().insert(
            "retry-after",
            secs.to_string().parse().expect("digits are valid metadata"),
        );
        status
    }
}

impl Guard {
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// Admits one request of `tenant`: a token from its bucket, then a slot under the in-flight
    /// bound, held until the returned permit drops.
    pub fn admit(&self, tenant: &TenantId) -> Result<OwnedSemaphorePermit, Shed> {
        if let Some(rate) = &self.rate {
            if let Err(wait) = rate.check(tenant) {
                RequestShed {
                    reason: ShedReason::RateLimited,
                }
                .emit();
                return Err(Shed::RateLimited(wait));
            }
        }
        self.in_flight.clone().try_acquire_owned().map_err(|_| {
            RequestShed {
                reason: ShedReason::Overloaded,
            }
            .emit();
            Shed::Overloaded
        })
    }
}

/// Middleware for the work routes: unknown credentials are refused here (401), then the
/// tenant's rate limit (429), then the in-flight bound (503); the permit is held until the
/// response is ready.
pub async fn guard(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let refused = match g.auth.tenant_for(authorization) {
        Ok(tenant) => match g.admit(&tenant) {
            Ok(_permit) => return next.run(req).await,
            Err(shed) => shed.response(),
        },
        Err(e) => ApiError(e).into_response(),
    };
    close_if_body_unread(&req, refused)
}

/// A refusal is answered before the request's body is read, and the server then drops the
/// connection rather than read a body it has refused. Saying so keeps an HTTP/1.1 client from
/// sending its next request down that connection (seen as "connection closed before message
/// completed" in clients that pool connections, under load shedding).
fn close_if_body_unread(req: &Request, mut refused: Response) -> Response {
    let http1 = req.version() <= axum::http::Version::HTTP_11;
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if http1 && has_body {
        refused
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TenantId {
        TenantId(s.into())
    }

    fn request(version: axum::http::Version, headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().version(version).uri("/v1/recall");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn a_refusal_closes_an_http1_connection_whose_body_is_unread() {
        use axum::http::Version;
        let refused = || Shed::Overloaded.response();
        let closes = |req: Request| {
            close_if_body_unread(&req, refused())
                .headers()
                .get(header::CONNECTION)
                .map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(
            closes(request(Version::HTTP_11, &[("content-length", "26")])),
            Some("close".into())
        );
        assert_eq!(
            closes(request(
                Version::HTTP_11,
                &[("transfer-encoding", "chunked")]
            )),
            Some("close".into())
        );
        // Nothing unread: the connection stays for the next request.
        assert_eq!(closes(request(Version::HTTP_11, &[])), None);
        assert_eq!(
            closes(request(Version::HTTP_11, &[("content-length", "0")])),
            None
        );
        // HTTP/2 multiplexes; a connection header is not allowed there.
        assert_eq!(
            closes(request(Version::HTTP_2, &[("content-length", "26")])),
            None
        );
    }

    #[test]
    fn bucket_allows_burst_then_refills() {
        let r = RateLimiter::new(10, 3, 100);
        let now = Instant::now();
        for _ in 0..3 {
            r.check_at(&t("a"), now).unwrap();
        }
        let wait = r.check_at(&t("a"), now).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        // Another tenant has its own bucket.
        r.check_at(&t("b"), now).unwrap();
        // 100 ms later one token is back.
        r.check_at(&t("a"), now + Duration::from_millis(100))
            .unwrap();
        assert!(r
            .check_at(&t("a"), now + Duration::from_millis(100))
            .is_err());
    }

    #[test]
    fn bucket_map_stays_bounded() {
        let r = RateLimiter::new(1, 5, 8);
        let now = Instant::now();
        for i in 0..1000 {
            r.check_at(&t(&format!("tenant-{i}")), now).unwrap();
            assert!(r.tracked_tenants() <= 8);
        }
    }
}
