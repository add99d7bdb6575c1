//! The optional LLM behind Recollect's seams: any OpenAI-compatible chat endpoint (OpenAI,
//! vLLM, Ollama, llama.cpp's server) through `async-openai`. Nothing needs it; with
//! `extractor.kind = "llm"` it adds what rules miss to the rule extraction (KeyMem's store
//! step asks an LLM for keywords, entities, locations, events and resolved times).

mod extractor;

use std::sync::Once;
use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestSystemMessage, ChatCompletionRequestUserMessage,
    CreateChatCompletionRequestArgs, ResponseFormat,
};
use async_openai::Client;
use backon::{ExponentialBuilder, Retryable};
use recollect_config::LlmSettings;

pub use extractor::LlmExtractor;

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Network trouble, a timeout, 429 or 5xx: retried, and retrying later may help.
    #[error("llm endpoint unavailable: {0}")]
    Unavailable(String),
    /// The endpoint refused the request (bad key, unknown model, …): retrying will not help.
    #[error("llm endpoint refused the request: {0}")]
    Refused(String),
    /// The model answered, but not with what was asked for.
    #[error("llm answer unusable: {0}")]
    Answer(String),
    #[error("llm client setup: {0}")]
    Setup(String),
}

fn classify(e: OpenAIError) -> LlmError {
    match e {
        OpenAIError::Reqwest(e) => LlmError::Unavailable(e.to_string()),
        OpenAIError::ApiError(r) => {
            let s = r.status_code.as_u16();
            if s == 429 || s == 408 || s >= 500 {
                LlmError::Unavailable(r.to_string())
            } else {
                LlmError::Refused(r.to_string())
            }
        }
        OpenAIError::JSONDeserialize(e, _) => LlmError::Answer(e.to_string()),
        OpenAIError::StreamError(e) => LlmError::Unavailable(e.to_string()),
        other => LlmError::Refused(other.to_string()),
    }
}

/// TLS for the endpoint with ring (already in the build through the Bolt client) instead of
/// reqwest's default aws-lc-rs, which needs cmake. Installed once per process.
fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err: another part of the process installed one first, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A chat model that answers with one JSON object, retried on transient failures.
pub struct ChatModel {
    client: Client<OpenAIConfig>,
    model: String,
    retries: usize,
}

impl ChatModel {
    pub fn new(s: &LlmSettings) -> Result<Self, LlmError> {
        install_crypto_provider();
        let http = reqwest_llm::Client::builder()
            .timeout(Duration::from_secs(s.timeout_secs.max(1)))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| LlmError::Setup(e.to_string()))?;
        let config = OpenAIConfig::new()
            .with_api_base(s.base_url.trim_end_matches('/'))
            .with_api_key(s.api_key.as_str());
        Ok(Self {
            client: Client::with_config(config).with_http_client(http),
            model: s.model.clone(),
            retries: s.max_retries,
        })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// Asks once (plus retries) and returns the answer's JSON object.
    pub async fn json(&self, system: &str, user: &str) -> Result<serde_json::Value, LlmError> {
        let request = CreateChatCompletionRequestArgs::default()
            .model(self.model.as_str())
            .temperature(0.0)
            .response_format(ResponseFormat::JsonObject)
            .messages([
                ChatCompletionRequestSystemMessage::from(system).into(),
                ChatCompletionRequestUserMessage::from(user).into(),
            ])
            .build()
            .map_err(|e| LlmError::Setup(e.to_string()))?;
        let answer = (|| async {
            self.client
                .chat()
                .create(request.clone())
                .await
                .map_err(classify)
        })
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(self.retries)
                .with_jitter(),
        )
        .when(|e| matches!(e, LlmError::Unavailable(_)))
        .notify(|e, wait| tracing::warn!(error = %e, ?wait, "llm request failed; retrying"))
        .await?;
        let text = answer
            .choices
            .first()
            .and_then(|c| c.message.content.clone())
            .ok_or_else(|| LlmError::Answer("no message content".into()))?;
        json_object(&text)
    }
}

/// The JSON object in a model's answer; tolerates a Markdown fence or prose around it.
pub fn json_object(text: &str) -> Result<serde_json::Value, LlmError> {
    let (Some(a), Some(b)) = (text.find('{'), text.rfind('}')) else {
        return Err(LlmError::Answer("no JSON object in the answer".into()));
    };
    if b < a {
        return Err(LlmError::Answer("no JSON object in the answer".into()));
    }
    serde_json::from_str(&text[a..=b]).map_err(|e| LlmError::Answer(e.to_string()))
}

/// The extractor `extractor.kind` names: the rules, or the rules plus the configured model.
pub fn extractor_from(
    settings: &recollect_config::Settings,
) -> Result<std::sync::Arc<dyn recollect_extract::Extractor>, LlmError> {
    Ok(match settings.extractor.kind {
        recollect_config::ExtractorKind::Rules => {
            std::sync::Arc::new(recollect_extract::RuleExtractor::new())
        }
        recollect_config::ExtractorKind::Llm => {
            std::sync::Arc::new(LlmExtractor::new(&settings.llm)?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_object_is_found_inside_fences_and_prose() {
        let v = json_object("Sure:\n```json\n{\"a\": [1, 2]}\n```").unwrap();
        assert_eq!(v["a"][1], 2);
        assert!(matches!(json_object("no"), Err(LlmError::Answer(_))));
        assert!(matches!(json_object("} {"), Err(LlmError::Answer(_))));
        assert!(matches!(json_object("{oops}"), Err(LlmError::Answer(_))));
    }
}
