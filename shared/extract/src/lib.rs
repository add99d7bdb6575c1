//! Rule-based extraction for Recollect: what KeyMem asks an LLM for (keywords, entities,
//! locations, events, resolved times and anaphors), done with rules so that the store path
//! needs no model and no network, and query analysis that mirrors it.

pub mod bm25;
pub mod query;
pub mod resolve;
pub mod rules;
pub mod text;
pub mod time;

mod lexicon;
mod names;

use recollect_model::{Classify, ErrorKind, Extraction, ReferenceState, Turn};

pub use query::{
    analyse_query, category_phrase, QueryAnalysis, QueryType, TimeHint, TimeHintKind, Want,
};
pub use resolve::Resolver;
pub use rules::RuleExtractor;
pub use time::{parse_date_time, parse_times};

/// Why an extraction failed. The rule extractor never fails; model-backed extractors behind
/// the same trait can.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// The input cannot be extracted from as given; retrying will not help.
    #[error("invalid extraction input: {0}")]
    Invalid(String),
    /// A backing model or service is down or overloaded; retrying may help.
    #[error("extractor unavailable: {0}")]
    Unavailable(String),
    #[error("extraction failed: {0}")]
    Internal(String),
}

impl Classify for ExtractError {
    fn kind(&self) -> ErrorKind {
        match self {
            ExtractError::Invalid(_) => ErrorKind::InvalidArgument,
            ExtractError::Unavailable(_) => ErrorKind::Unavailable,
            ExtractError::Internal(_) => ErrorKind::Internal,
        }
    }
}

/// One extraction strategy (rules here; an LLM elsewhere), swappable behind the extractor
/// service.
#[async_trait::async_trait]
pub trait Extractor: Send + Sync {
    /// Recorded in `Extraction::extractor`: "rules", "llm:<model>".
    fn name(&self) -> &str;
    /// Extract from one turn, resolving references against and then updating `state` (the
    /// conversation's state). Turns of one conversation must be passed in order.
    async fn extract(
        &self,
        turn: &Turn,
        state: &mut ReferenceState,
    ) -> Result<Extraction, ExtractError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_classify() {
        assert_eq!(
            ExtractError::Invalid("x".into()).kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            ExtractError::Unavailable("x".into()).kind(),
            ErrorKind::Unavailable
        );
        assert_eq!(
            ExtractError::Internal("x".into()).kind(),
            ErrorKind::Internal
        );
        assert_eq!(
            ExtractError::Invalid("bad".into()).to_string(),
            "invalid extraction input: bad"
        );
    }
}
