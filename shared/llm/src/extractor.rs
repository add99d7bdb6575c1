//! `extractor.kind = "llm"`: the rule extraction, then one chat completion per turn whose
//! answer adds keywords, entities, locations, events and times the rules missed. The rules keep
//! what they are exact at (speakers, reference resolution, the state machine); the answer is
//! validated item by item, so a model that rambles cannot write junk into the graph.

use std::collections::HashSet;

use chrono::{Datelike, NaiveDate};
use recollect_config::LlmSettings;
use recollect_extract::text::{is_stopword, stem};
use recollect_extract::{ExtractError, Extractor, Resolver, RuleExtractor};
use recollect_model::{Extraction, Keyword, ReferenceState, TimeRef, Turn};
use serde::Deserialize;

use crate::{ChatModel, LlmError};

const SYSTEM: &str = "You index one turn of a chat for later recall. Answer with one JSON \
object and nothing else: {\"keywords\": [], \"entities\": [], \"locations\": [], \
\"events\": [], \"times\": [{\"text\": \"\", \"start\": \"YYYY-MM-DD\", \"end\": \
\"YYYY-MM-DD\", \"granularity\": \"day|week|month|season|year\"}]}. keywords: content words \
and short phrases (1-3 words) a later question could use, including the general term for \
specific things (a 'violin' is also 'music', 'instrument'). entities: people, pets, groups, \
organisations, titles of works, as written; replace pronouns by the name when the turn makes \
it clear. locations: places. events: short verb+object phrases of what happened or is \
planned. times: every time expression, resolved to calendar dates against the turn time. \
Use empty lists when there is nothing.";

/// Bounds on what one answer may add.
const MAX_ITEMS: usize = 24;
const MAX_ITEM_CHARS: usize = 80;
const MAX_KEYWORD_WORDS: usize = 3;

#[derive(Debug, Default, Deserialize)]
struct Answer {
    #[serde(default)]
    keywords: Vec<serde_json::Value>,
    #[serde(default)]
    entities: Vec<serde_json::Value>,
    #[serde(default)]
    locations: Vec<serde_json::Value>,
    #[serde(default)]
    events: Vec<serde_json::Value>,
    #[serde(default)]
    times: Vec<serde_json::Value>,
}

/// Rules plus an OpenAI-compatible model; see the module comment.
pub struct LlmExtractor {
    rules: RuleExtractor,
    resolver: Resolver,
    model: ChatModel,
    fallback_to_rules: bool,
    name: String,
}

impl LlmExtractor {
    pub fn new(settings: &LlmSettings) -> Result<Self, LlmError> {
        let model = ChatModel::new(settings)?;
        Ok(Self {
            name: format!("llm:{}", model.model()),
            rules: RuleExtractor::new(),
            resolver: Resolver,
            model,
            fallback_to_rules: settings.fallback_to_rules,
        })
    }
}

fn prompt(turn: &Turn, state: &ReferenceState) -> String {
    let who = |s: &Option<String>, d: &str| s.clone().unwrap_or_else(|| d.to_string());
    let mut p = format!(
        "Turn time: {} ({})\n",
        turn.timestamp.format("%Y-%m-%dT%H:%M:%SZ"),
        turn.timestamp.weekday()
    );
    if !state.entities.is_empty() || !state.locations.is_empty() {
        p.push_str(&format!(
            "Recently mentioned: {}\n",
            state
                .entities
                .iter()
                .chain(&state.locations)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    p.push_str(&format!(
        "{}: {}\n",
        who(&turn.user_speaker, "user"),
        turn.user
    ));
    if !turn.assistant.trim().is_empty() {
        p.push_str(&format!(
            "{}: {}\n",
            who(&turn.assistant_speaker, "assistant"),
            turn.assistant
        ));
    }
    p
}

/// A short printable string, or nothing.
fn item(v: &serde_json::Value) -> Option<String> {
    let s = v.as_str()?.trim();
    let ok =
        !s.is_empty() && s.chars().count() <= MAX_ITEM_CHARS && !s.chars().any(|c| c.is_control());
    ok.then(|| s.to_string())
}

/// Keyword node key and text for a phrase: lower case, stemmed, function words dropped.
fn keyword(phrase: &str) -> Option<Keyword> {
    let words: Vec<String> = phrase
        .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '\''))
        .filter(|w| !w.is_empty() && !is_stopword(w))
        .map(str::to_lowercase)
        .collect();
    if words.is_empty() || words.len() > MAX_KEYWORD_WORDS {
        return None;
    }
    Some(Keyword {
        key: words.iter().map(|w| stem(w)).collect::<Vec<_>>().join(" "),
        text: words.join(" "),
    })
}

/// A time the model resolved: dates that parse, in order, within a century of the turn.
fn time(v: &serde_json::Value, turn: &Turn) -> Option<TimeRef> {
    let text = item(v.get("text")?)?;
    let start = NaiveDate::parse_from_str(v.get("start")?.as_str()?, "%Y-%m-%d").ok()?;
    let end = match v.get("end").and_then(|e| e.as_str()) {
        Some(e) => NaiveDate::parse_from_str(e, "%Y-%m-%d").ok()?,
        None => start,
    };
    let year = turn.timestamp.year();
    if end < start || (start.year() - year).abs() > 100 || (end - start).num_days() > 3660 {
        return None;
    }
    let granularity = match v.get("granularity").and_then(|g| g.as_str()) {
        Some(g @ ("day" | "week" | "month" | "season" | "year")) => g.to_string(),
        _ if start == end => "day".to_string(),
        _ => "range".to_string(),
    };
    Some(TimeRef {
        text,
        start,
        end,
        granularity,
    })
}

/// Adds the answer's items that the rules did not find.
fn merge(mut ex: Extraction, answer: &Answer, turn: &Turn) -> Extraction {
    let mut keys: HashSet<String> = ex.keywords.iter().map(|k| k.key.clone()).collect();
    for k in answer.keywords.iter().take(MAX_ITEMS).filter_map(item) {
        if let Some(k) = keyword(&k) {
            if keys.insert(k.key.clone()) {
                ex.keywords.push(k);
            }
        }
    }
    for (target, from) in [
        (&mut ex.entities, &answer.entities),
        (&mut ex.locations, &answer.locations),
        (&mut ex.events, &answer.events),
    ] {
        let mut seen: HashSet<String> = target.iter().map(|s| s.to_lowercase()).collect();
        for s in from.iter().take(MAX_ITEMS).filter_map(item) {
            if seen.insert(s.to_lowercase()) {
                target.push(s);
            }
        }
    }
    let had_times = !ex.times.is_empty();
    let mut seen: HashSet<String> = ex.times.iter().map(TimeRef::key).collect();
    for t in answer
        .times
        .iter()
        .take(MAX_ITEMS)
        .filter_map(|v| time(v, turn))
    {
        if seen.insert(t.key()) {
            ex.times.push(t);
        }
    }
    if !had_times {
        if let Some(d) = ex.times.first().and_then(|t| t.start.and_hms_opt(0, 0, 0)) {
            ex.event_time = Some(d.and_utc());
        }
    }
    ex
}

#[async_trait::async_trait]
impl Extractor for LlmExtractor {
    fn name(&self) -> &str {
        &self.name
    }

    async fn extract(
        &self,
        turn: &Turn,
        state: &mut ReferenceState,
    ) -> Result<Extraction, ExtractError> {
        // The rules run on a copy: the state is updated once, with the merged extraction.
        let mut after_rules = state.clone();
        let base = self.rules.extract_sync(turn, &mut after_rules);
        let answer = self
            .model
            .json(SYSTEM, &prompt(turn, state))
            .await
            .and_then(|v| {
                serde_json::from_value::<Answer>(v).map_err(|e| LlmError::Answer(e.to_string()))
            });
        match answer {
            Ok(answer) => {
                let mut ex = merge(base, &answer, turn);
                ex.extractor = self.name.clone();
                self.resolver.update(state, &ex);
                Ok(ex)
            }
            Err(e) if self.fallback_to_rules => {
                tracing::warn!(error = %e, memory_id = %turn.memory_id, "llm extraction failed; keeping the rule extraction");
                *state = after_rules;
                Ok(base)
            }
            Err(LlmError::Unavailable(e)) => Err(ExtractError::Unavailable(e)),
            Err(e) => Err(ExtractError::Internal(e.to_string())),
        }
    }
}
