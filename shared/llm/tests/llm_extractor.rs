//! The LLM extractor against a local OpenAI-compatible endpoint (an axum stand-in that answers
//! like `/v1/chat/completions` and records what it was sent): the request it makes, how the
//! answer is merged and validated, retries, and the fallback to the rules.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use chrono::{TimeZone, Utc};
use parking_lot::Mutex;
use recollect_config::{LlmSettings, Settings};
use recollect_extract::{ExtractError, Extractor, RuleExtractor};
use recollect_llm::LlmExtractor;
use recollect_model::{MemoryId, ReferenceState, TenantId, Turn};

#[derive(Default)]
struct Endpoint {
    /// Answer contents, one per request; the last one repeats.
    answers: Mutex<Vec<(StatusCode, String)>>,
    requests: Mutex<Vec<(Option<String>, serde_json::Value)>>,
    calls: AtomicUsize,
}

async fn chat(
    State(ep): State<Arc<Endpoint>>,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> (StatusCode, Json<serde_json::Value>) {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    ep.requests.lock().push((auth, body));
    let n = ep.calls.fetch_add(1, Ordering::SeqCst);
    let answers = ep.answers.lock();
    let (status, content) = answers[n.min(answers.len() - 1)].clone();
    if status != StatusCode::OK {
        return (
            status,
            Json(
                serde_json::json!({"error": {"message": "try later", "type": "server_error", "param": null, "code": null}}),
            ),
        );
    }
    (
        status,
        Json(serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "test-model",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        })),
    )
}

async fn endpoint(answers: Vec<(StatusCode, String)>) -> (Arc<Endpoint>, String) {
    let ep = Arc::new(Endpoint {
        answers: Mutex::new(answers),
        ..Default::default()
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(ep.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (ep, url)
}

fn settings(url: &str, fallback: bool) -> LlmSettings {
    let mut s = Settings::defaults().llm;
    s.base_url = url.to_string();
    s.model = "test-model".into();
    s.api_key = "sk-test".into();
    s.timeout_secs = 5;
    s.max_retries = 2;
    s.fallback_to_rules = fallback;
    s
}

fn turn() -> Turn {
    Turn {
        memory_id: MemoryId::nil(),
        tenant: TenantId("t".into()),
        conversation_id: "c".into(),
        turn_id: "1".into(),
        position: 0,
        user: "We finally brought the kitten home from the shelter last Tuesday!".into(),
        assistant: "That is wonderful news, what did you name her?".into(),
        user_speaker: Some("Caroline".into()),
        assistant_speaker: Some("Melanie".into()),
        timestamp: Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap(),
        recorded_at: Utc::now(),
        metadata: Default::default(),
        user_id: None,
        agent_id: None,
        version: 1,
        first_recorded_at: None,
        expired_at: None,
    }
}

const GOOD: &str = r#"{"keywords": ["kitten", "animal shelter", "pet adoption", "", "a b c d e"],
 "entities": ["Luna", "caroline", 7],
 "locations": ["Portland"],
 "events": ["adopted a kitten"],
 "times": [{"text": "last Tuesday", "start": "2023-05-02", "end": "2023-05-02", "granularity": "day"},
           {"text": "bogus", "start": "2023-13-40"},
           {"text": "backwards", "start": "2023-05-02", "end": "2023-04-01"}]}"#;

#[tokio::test]
async fn answer_is_merged_into_the_rule_extraction() {
    let (ep, url) = endpoint(vec![(StatusCode::OK, format!("```json\n{GOOD}\n```"))]).await;
    let x = LlmExtractor::new(&settings(&url, false)).unwrap();
    assert_eq!(x.name(), "llm:test-model");
    let mut state = ReferenceState::default();
    let ex = x.extract(&turn(), &mut state).await.unwrap();

    let mut rules_state = ReferenceState::default();
    let rules = RuleExtractor::new().extract_sync(&turn(), &mut rules_state);
    // Everything the rules found is still there.
    for k in &rules.keywords {
        assert!(ex.keywords.contains(k), "lost rule keyword {k:?}");
    }
    for e in &rules.entities {
        assert!(ex.entities.contains(e), "lost rule entity {e}");
    }
    // The model's additions, validated: stemmed phrase keys, no duplicates (case-insensitive),
    // no empty or over-long items, no non-strings, only dates that parse and are in order.
    let keys: Vec<&str> = ex.keywords.iter().map(|k| k.key.as_str()).collect();
    assert!(keys.contains(&"anim shelter"), "{keys:?}");
    assert!(keys.contains(&"pet adopt"), "{keys:?}");
    assert!(!keys.iter().any(|k| k.split(' ').count() > 3), "{keys:?}");
    assert!(ex.entities.iter().any(|e| e == "Luna"), "{:?}", ex.entities);
    assert_eq!(
        ex.entities
            .iter()
            .filter(|e| e.eq_ignore_ascii_case("caroline"))
            .count(),
        1
    );
    assert!(ex.locations.iter().any(|l| l == "Portland"));
    assert!(ex.events.iter().any(|e| e == "adopted a kitten"));
    assert!(ex.times.iter().all(|t| t.start <= t.end));
    assert!(!ex
        .times
        .iter()
        .any(|t| t.text == "bogus" || t.text == "backwards"));
    assert!(ex.times.iter().any(|t| t.start.to_string() == "2023-05-02"));
    assert_eq!(ex.extractor, "llm:test-model");
    // The state machine saw the merged extraction: the model's entity is now in focus.
    assert!(state.entities.iter().any(|e| e == "Luna"), "{state:?}");
    assert_eq!(state.turns_seen, 1);

    // The request: the configured model, a JSON answer asked for, deterministic, the key sent,
    // the turn's text and time in the prompt.
    let requests = ep.requests.lock();
    assert_eq!(requests.len(), 1);
    let (auth, body) = &requests[0];
    assert_eq!(auth.as_deref(), Some("Bearer sk-test"));
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["response_format"]["type"], "json_object");
    assert_eq!(body["temperature"], 0.0);
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(user.contains("kitten home from the shelter") && user.contains("2023-05-08"));
    assert!(user.contains("Caroline:") && user.contains("Melanie:"));
}

#[tokio::test]
async fn transient_failures_are_retried() {
    let (ep, url) = endpoint(vec![
        (StatusCode::SERVICE_UNAVAILABLE, String::new()),
        (StatusCode::TOO_MANY_REQUESTS, String::new()),
        (StatusCode::OK, GOOD.to_string()),
    ])
    .await;
    let x = LlmExtractor::new(&settings(&url, false)).unwrap();
    let ex = x
        .extract(&turn(), &mut ReferenceState::default())
        .await
        .unwrap();
    assert_eq!(ep.calls.load(Ordering::SeqCst), 3);
    assert!(ex.entities.iter().any(|e| e == "Luna"));
}

#[tokio::test]
async fn unusable_answers_fall_back_to_the_rules() {
    let (ep, url) = endpoint(vec![(StatusCode::OK, "I cannot help with that.".into())]).await;
    let x = LlmExtractor::new(&settings(&url, true)).unwrap();
    let mut state = ReferenceState::default();
    let ex = x.extract(&turn(), &mut state).await.unwrap();
    let mut rules_state = ReferenceState::default();
    let rules = RuleExtractor::new().extract_sync(&turn(), &mut rules_state);
    assert_eq!(ex, rules);
    assert_eq!(state, rules_state);
    // Not retried: the model answered, retrying the same prompt at temperature 0 is pointless.
    assert_eq!(ep.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn without_fallback_an_unreachable_endpoint_is_unavailable_and_changes_nothing() {
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let x = LlmExtractor::new(&settings(&format!("http://127.0.0.1:{port}/v1"), false)).unwrap();
    let mut state = ReferenceState::default();
    let e = x.extract(&turn(), &mut state).await.unwrap_err();
    assert!(matches!(e, ExtractError::Unavailable(_)), "{e}");
    assert_eq!(state, ReferenceState::default());
}

#[tokio::test]
async fn a_refused_request_is_not_retried() {
    let (ep, url) = endpoint(vec![(StatusCode::UNAUTHORIZED, String::new())]).await;
    let x = LlmExtractor::new(&settings(&url, false)).unwrap();
    let e = x
        .extract(&turn(), &mut ReferenceState::default())
        .await
        .unwrap_err();
    assert!(matches!(e, ExtractError::Internal(_)), "{e}");
    assert_eq!(ep.calls.load(Ordering::SeqCst), 1);
}
