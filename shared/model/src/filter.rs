//! Which turns a recall may return beyond its conversations: the platform's end users and
//! agents, a time range, speakers and equality on metadata. One definition, checked the same
//! way by every entry point, applied by each store inside its own search (payload filters in the
//! vector index, turn properties in the graph) and by [`TurnFilter::matches`] where a path
//! reads turns itself.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::Turn;

/// At most this many ids, speakers or metadata keys in one filter: a filter is a scope, not a
/// list of everything a platform knows.
pub const MAX_FILTER_VALUES: usize = 1000;
pub const MAX_METADATA_KEYS: usize = 16;

/// Turn-level conditions, all of which must hold (AND); within a list, any value (OR).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnFilter {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_ids: Vec<String>,
    /// Either speaker of the turn is one of these (exact match).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub speakers: Vec<String>,
    /// The turn's timestamp is at or after `from`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<DateTime<Utc>>,
    /// The turn's timestamp is before `to`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<DateTime<Utc>>,
    /// Metadata key → the value it must equal (string, number or boolean).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, serde_json::Value>,
}

/// Ids of end users and agents: the same plain alphabet as conversation ids, since they become
/// keys and payload values in every store.
pub fn validate_scope_id(field: &str, id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 128 {
        return Err(format!("{field} must be 1 to 128 characters"));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@'))
    {
        return Err(format!(
            "{field} may contain only letters, digits and _ - . : @"
        ));
    }
    Ok(())
}

/// Metadata keys a filter can name: they become payload paths (`metadata.<key>`), so no dots.
fn valid_metadata_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 64
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
}

impl TurnFilter {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Whether the filter narrows the conversations by who took part (resolved through the
    /// graph's index of users and agents before any path runs).
    pub fn has_participants(&self) -> bool {
        !self.user_ids.is_empty() || !self.agent_ids.is_empty()
    }

    /// Checks a filter from a client; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        for (field, list) in [
            ("user_ids", &self.user_ids),
            ("agent_ids", &self.agent_ids),
            ("speakers", &self.speakers),
        ] {
            if list.len() > MAX_FILTER_VALUES {
                return Err(format!("{field}: at most {MAX_FILTER_VALUES} values"));
            }
            for (i, v) in list.iter().enumerate() {
                if field == "speakers" {
                    if v.trim().is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
                        return Err(format!(
                            "{field}[{i}] must be 1 to 256 printable characters"
                        ));
                    }
                } else {
                    validate_scope_id(&format!("{field}[{i}]"), v)?;
                }
            }
        }
        for (field, t) in [("from", self.from), ("to", self.to)] {
            if let Some(t) = t {
                let year = chrono::Datelike::year(&t);
                if !(1900..=2200).contains(&year) {
                    return Err(format!("{field}: year {year} is out of range"));
                }
            }
        }
        if let (Some(f), Some(t)) = (self.from, self.to) {
            if f >= t {
                return Err("from must be before to".into());
            }
        }
        if self.metadata.len() > MAX_METADATA_KEYS {
            return Err(format!("metadata: at most {MAX_METADATA_KEYS} keys"));
        }
        for (k, v) in &self.metadata {
            if !valid_metadata_key(k) {
                return Err(format!(
                    "metadata.{k}: filter keys are 1 to 64 letters, digits, _ or -"
                ));
            }
            match v {
                serde_json::Value::String(s) if s.len() <= 1024 => {}
                serde_json::Value::String(_) => {
                    return Err(format!("metadata.{k}: values are at most 1024 bytes"))
                }
                serde_json::Value::Bool(_) => {}
                serde_json::Value::Number(n) if n.as_f64().is_some_and(f64::is_finite) => {}
                _ => {
                    return Err(format!(
                        "metadata.{k}: only string, number and boolean values can be filtered on"
                    ))
                }
            }
        }
        Ok(())
    }

    /// Whether a turn passes (the same rule the stores apply in their own searches).
    pub fn matches(&self, t: &Turn) -> bool {
        let any = |list: &[String], v: &Option<String>| {
            list.is_empty() || v.as_ref().is_some_and(|v| list.contains(v))
        };
        if !any(&self.user_ids, &t.user_id) || !any(&self.agent_ids, &t.agent_id) {
            return false;
        }
        if !self.speakers.is_empty() && !t.speakers().any(|s| self.speakers.iter().any(|x| x == s))
        {
            return false;
        }
        if self.from.is_some_and(|f| t.timestamp < f) || self.to.is_some_and(|e| t.timestamp >= e) {
            return false;
        }
        self.metadata
            .iter()
            .all(|(k, want)| t.metadata.get(k).is_some_and(|got| same_value(got, want)))
    }
}

/// Equality as the vector stores apply it: numbers by value (3 equals 3.0), strings and
/// booleans exactly.
pub fn same_value(got: &serde_json::Value, want: &serde_json::Value) -> bool {
    match (got, want) {
        (serde_json::Value::Number(a), serde_json::Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

impl Turn {
    /// The speakers of the turn's non-empty fields.
    pub fn speakers(&self) -> impl Iterator<Item = &str> {
        [
            self.user_speaker.as_deref(),
            (!self.assistant.is_empty())
                .then_some(self.assistant_speaker.as_deref())
                .flatten(),
        ]
        .into_iter()
        .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryId, TenantId};
    use serde_json::json;

    fn turn() -> Turn {
        Turn {
            memory_id: MemoryId::nil(),
            tenant: TenantId("t".into()),
            conversation_id: "c".into(),
            turn_id: "1".into(),
            position: 0,
            user: "hi".into(),
            assistant: "hello".into(),
            user_speaker: Some("Maya".into()),
            assistant_speaker: Some("Bot".into()),
            timestamp: "2023-05-08T10:00:00Z".parse().unwrap(),
            recorded_at: Turn::UNRECORDED,
            metadata: json!({"channel": "web", "priority": 3, "paid": true})
                .as_object()
                .unwrap()
                .clone(),
            user_id: Some("u1".into()),
            agent_id: None,
            version: 1,
            first_recorded_at: None,
            expired_at: None,
        }
    }

    #[test]
    fn every_condition_must_hold() {
        let t = turn();
        assert!(TurnFilter::default().matches(&t));
        let f = |v: serde_json::Value| -> TurnFilter { serde_json::from_value(v).unwrap() };
        assert!(f(json!({"user_ids": ["u2", "u1"]})).matches(&t));
        assert!(!f(json!({"user_ids": ["u2"]})).matches(&t));
        assert!(!f(json!({"agent_ids": ["a"]})).matches(&t), "no agent id");
        assert!(f(json!({"speakers": ["Bot"]})).matches(&t));
        assert!(!f(json!({"speakers": ["maya"]})).matches(&t), "exact match");
        assert!(
            f(json!({"from": "2023-05-08T10:00:00Z"})).matches(&t),
            "from is inclusive"
        );
        assert!(
            !f(json!({"to": "2023-05-08T10:00:00Z"})).matches(&t),
            "to is exclusive"
        );
        assert!(
            f(json!({"metadata": {"channel": "web", "priority": 3.0, "paid": true}})).matches(&t)
        );
        assert!(
            !f(json!({"metadata": {"priority": "3"}})).matches(&t),
            "types differ"
        );
        assert!(!f(json!({"metadata": {"missing": "x"}})).matches(&t));
        assert!(!f(json!({"user_ids": ["u1"], "metadata": {"paid": false}})).matches(&t));
    }

    #[test]
    fn validation_names_the_field() {
        let f = |v: serde_json::Value| -> TurnFilter { serde_json::from_value(v).unwrap() };
        for (v, field) in [
            (json!({"user_ids": ["ok", "bad id"]}), "user_ids[1]"),
            (json!({"agent_ids": [""]}), "agent_ids[0]"),
            (json!({"speakers": [" "]}), "speakers[0]"),
            (
                json!({"from": "2023-05-09T00:00:00Z", "to": "2023-05-08T00:00:00Z"}),
                "from",
            ),
            (json!({"to": "1800-01-01T00:00:00Z"}), "to"),
            (json!({"metadata": {"a.b": 1}}), "metadata.a.b"),
            (json!({"metadata": {"tags": ["x"]}}), "metadata.tags"),
            (json!({"metadata": {"n": null}}), "metadata.n"),
        ] {
            let e = f(v.clone()).validate().unwrap_err();
            assert!(e.starts_with(field), "{v}: {e}");
        }
        assert!(f(
            json!({"user_ids": ["u-1@x.io"], "metadata": {"k_1": "v", "n": 2.5, "b": false}})
        )
        .validate()
        .is_ok());
    }
}
