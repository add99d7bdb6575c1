//! The `VectorIndex` seam: per turn one dense vector per field (user, assistant; never their
//! concatenation) and a sparse lexical vector scored as BM25 by the engine's IDF modifier; per
//! conversation the vectors of its keywords, for KeyMem's keyword-neighbour search (every form
//! a keyword was said in, "games" and "game", in both engines).

#[cfg(feature = "embedded")]
pub mod edge;
#[cfg(feature = "embedded")]
mod keyword_forms;
#[cfg(feature = "qdrant")]
pub mod qdrant;
#[cfg(feature = "remote")]
pub mod remote;

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use recollect_model::{KeywordVector, MemoryId, SparseVector, TenantId, TokenVectors};

use crate::{Scope, StoreError};

pub const USER_VECTOR: &str = "user";
pub const ASSISTANT_VECTOR: &str = "assistant";
pub const LEXICAL_VECTOR: &str = "lexical";
pub const KEYWORD_VECTOR: &str = "keyword";
/// A turn's token vectors (late interaction), when the index was opened with a width for them.
pub const LATE_VECTOR: &str = "late";

/// One conversation's keyword vectors, as a writer's batch carries them.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct KeywordSet {
    pub tenant: TenantId,
    pub conversation: String,
    pub keywords: Vec<KeywordVector>,
}

/// A turn's point.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TurnPoint {
    pub memory_id: MemoryId,
    pub tenant: TenantId,
    pub conversation_id: String,
    pub turn_id: String,
    pub position: u64,
    pub timestamp: DateTime<Utc>,
    pub user_speaker: Option<String>,
    pub assistant_speaker: Option<String>,
    /// What a recall's [`recollect_model::TurnFilter`] can select on, besides the above.
    #[serde(default)]
    pub user_id: Option<String>,
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// When this version of the turn was recorded: recall as of an earlier time selects on it.
    #[serde(default = "epoch")]
    pub recorded_at: DateTime<Utc>,
    pub user: Vec<f32>,
    /// None when the turn has no assistant text.
    pub assistant: Option<Vec<f32>>,
    pub lexical: SparseVector,
    /// Both fields' token vectors (late interaction), when the embedder made them.
    #[serde(default)]
    pub late: Option<TokenVectors>,
}

/// The payload key of a turn's token rows' sentences (`TokenVectors::segments`, one small
/// integer per row): recall's sentence term reads them beside the rows.
pub const LATE_SEGMENTS: &str = "late_segments";

/// The tenant key kept versions are stored under, beside the current points: every search of
/// the present is filtered on the tenant (the tenant index), so it passes them by at no cost.
/// Tenant ids hold no NUL, so no tenant has this key.
pub fn history_tenant(tenant: &TenantId) -> String {
    format!("{}\u{0}history", tenant.as_str())
}

/// The point id of a kept version: from the memory id and when that version was recorded.
pub fn version_point_id(memory_id: MemoryId, recorded_at: DateTime<Utc>) -> MemoryId {
    MemoryId::derive(
        &TenantId("version".into()),
        &memory_id.to_string(),
        &recorded_at
            .timestamp_nanos_opt()
            .unwrap_or(i64::MAX)
            .to_string(),
    )
}

/// An index holding vectors of another width than `embedder.model` gives: every backend
/// refuses it when it opens, before anything is written, naming both widths and the way out.
pub(crate) fn another_width(index: &str, held: u64, wants: usize, way_out: &str) -> StoreError {
    StoreError::Invalid(format!(
        "the vector index {index} holds {held}-dimension vectors and embedder.model gives \
         {wants}: run with the model that wrote it, or {way_out} and run `recollect reindex`"
    ))
}

/// What tells a keyword's forms apart: FNV-1a over its vector's bits (the embedding of the
/// surface text the extractor kept, "games" or "game" for the stem `game`).
pub(crate) fn form_hash(vector: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in vector {
        for b in x.to_bits().to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// One engine search's points in the engine's order, each with its memory id where it names one
/// and its final score.
pub(crate) type EngineHits = Vec<(Option<MemoryId>, f32)>;

/// The best `limit` results of a search, highest score first with ties settled by memory id,
/// smaller first. `search(asked)` makes the engine's searches (the current versions, and the
/// replaced ones for an `as_of` scope), each asked for `asked` results, and returns each one's
/// points. The first ask is one beyond `limit`; while a search came back full and ends on the
/// score of the last point kept, a tied point may be missing, so it asks again for twice as many.
///
/// An engine keeps whichever tied points it meets first, and that follows how its points sit in
/// segments, so the optimiser's timing: two ingests of the same turns ranked differently when
/// the machine was busy (a BM25 tie at the lexical retriever's depth, docs/EVALUATION.md).
pub(crate) async fn search_settling_ties<F, Fut>(
    limit: usize,
    mut search: F,
) -> Result<Vec<(MemoryId, f32)>, StoreError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<EngineHits>, StoreError>>,
{
    let mut asked = limit.saturating_add(1);
    loop {
        let searches = search(asked).await?;
        let full_ends: Vec<f32> = searches
            .iter()
            .filter(|hits| hits.len() >= asked)
            .filter_map(|hits| hits.last().map(|h| h.1))
            .collect();
        let found = searches
            .into_iter()
            .flatten()
            .filter_map(|(m, score)| m.map(|m| (m, score)))
            .collect();
        match settle_ties(found, limit, full_ends) {
            Some(best) => return Ok(best),
            None => asked = asked.saturating_mul(2),
        }
    }
}

/// One engine search's keyword points in the engine's order: each one's keyword, where its
/// payload names one, and its score.
pub(crate) type KeywordPoints = Vec<(Option<String>, f32)>;

/// The best `limit` distinct keywords of a search whose points repeat a keyword (one point per
/// form, and per conversation where the engine keeps them so), highest score first with ties
/// settled by name. `search(asked)` returns the engine's best `asked` points. It is asked for
/// four points a name, and four times as many again while the points came back full and either
/// named fewer than `limit` keywords or ended on the score of the last name kept (a tied name
/// may be missing): a tenant-wide search over conversations that share a keyword meets it in
/// every one of them (docs/EVALUATION.md session 23).
pub(crate) async fn search_keyword_names<F, Fut>(
    limit: usize,
    mut search: F,
) -> Result<Vec<(String, f32)>, StoreError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<KeywordPoints, StoreError>>,
{
    if limit == 0 {
        return Ok(vec![]);
    }
    let mut asked = limit.saturating_mul(4);
    loop {
        let points = search(asked).await?;
        let (full, end) = (points.len() >= asked, points.last().map(|p| p.1));
        let mut best: HashMap<String, f32> = HashMap::with_capacity(points.len());
        for (name, score) in points {
            if let Some(name) = name {
                // A name's best form is its score.
                let s = best.entry(name).or_insert(score);
                *s = s.max(score);
            }
        }
        let mut names: Vec<(String, f32)> = best.into_iter().collect();
        names.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let may_miss = names
            .get(limit - 1)
            .is_none_or(|cut| end.is_some_and(|e| e.total_cmp(&cut.1).is_eq()));
        if !full || !may_miss || asked == usize::MAX {
            names.truncate(limit);
            return Ok(names);
        }
        asked = asked.saturating_mul(4);
    }
}

/// The best `limit` of `found`, or None when a point tied with the last one kept may be missing
/// (`full_ends`: the last score of each search that came back full).
fn settle_ties(
    mut found: Vec<(MemoryId, f32)>,
    limit: usize,
    full_ends: impl IntoIterator<Item = f32>,
) -> Option<Vec<(MemoryId, f32)>> {
    found.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if let Some(cut) = limit.checked_sub(1).and_then(|i| found.get(i)).map(|h| h.1) {
        if full_ends.into_iter().any(|end| end.total_cmp(&cut).is_eq()) {
            return None;
        }
    }
    found.truncate(limit);
    Some(found)
}

/// The token vectors (late interaction) an index is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenVectorsWanted {
    #[default]
    No,
    /// Rows of this width; an index made without them is refused, since they cannot be added to
    /// the turns it already holds (`embedder.late_model` names a model).
    Required(usize),
    /// Rows of this width where the index can hold them: a new index is made with them, one
    /// made without them opens without, and says so (`embedder.late_model = "auto"`).
    WherePossible(usize),
}

impl From<Option<usize>> for TokenVectorsWanted {
    fn from(width: Option<usize>) -> Self {
        width.map_or(Self::No, Self::Required)
    }
}

impl TokenVectorsWanted {
    pub fn width(self) -> Option<usize> {
        match self {
            Self::No => None,
            Self::Required(w) | Self::WherePossible(w) => Some(w),
        }
    }
}

fn epoch() -> DateTime<Utc> {
    DateTime::<Utc>::UNIX_EPOCH
}

/// A version of a turn an edit replaces: its points are kept (for recall as of an earlier
/// time) until the memory is erased.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplacedVersion {
    pub memory_id: MemoryId,
    /// When the replaced version was recorded (it names the kept copy).
    pub recorded_at: DateTime<Utc>,
    /// When the edit replaced it.
    pub expired_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum VectorField {
    User,
    Assistant,
}

impl VectorField {
    pub fn name(&self) -> &'static str {
        match self {
            VectorField::User => USER_VECTOR,
            VectorField::Assistant => ASSISTANT_VECTOR,
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum VectorQuery {
    Dense {
        field: VectorField,
        vector: Vec<f32>,
    },
    Lexical(SparseVector),
    /// Late interaction over the whole scope: each turn's MaxSim to the question's token
    /// vectors (the mean over the question's tokens of each one's best cosine among the
    /// turn's). An index without token vectors returns nothing. Its cost grows with the scope's
    /// turns (the turns' token vectors are scanned, not searched through a graph).
    Late(TokenVectors),
}

/// Dense vectors of a stored turn.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FieldVectors {
    pub user: Vec<f32>,
    pub assistant: Option<Vec<f32>>,
}

/// When an embedded index makes its turn and keyword upserts durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flushes {
    /// Each upsert flushes before it returns.
    #[default]
    EachWrite,
    /// Upserts return once written; [`VectorIndex::sync`] flushes them, one flush for every
    /// write since the last. For a caller that can replay what a crash loses (the single
    /// binary replays turns not yet marked stored): a flush costs the same for one batch as
    /// for ten, most of it fixed (every segment's files synced, small files rewritten).
    OnSync,
}

#[async_trait]
pub trait VectorIndex: Send + Sync + 'static {
    fn kind(&self) -> &'static str;

    /// Whether this index keeps turns' token vectors and scores them ([`Self::late_scores`]);
    /// None when it cannot tell (an index behind another service).
    fn holds_token_vectors(&self) -> Option<bool> {
        None
    }

    /// Upserts turn points (idempotent on memory id); returns when durable, or, for an index
    /// opened to defer its flushes ([`VectorIndex::sync`]), once written.
    async fn upsert_turns(&self, points: Vec<TurnPoint>) -> Result<(), StoreError>;

    /// Best `limit` turns in scope (its conversations and its turn filter) for the query,
    /// highest score first: the filter applies inside the search, so `limit` matching turns
    /// come back whenever that many exist. Ties are settled by memory id, smaller first, at the
    /// limit too, so the same turns give the same answer however the engine holds them.
    async fn search(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        query: &VectorQuery,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, StoreError>;

    /// Dense field vectors of the given turns (tenant-checked).
    async fn field_vectors(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError>;

    /// Keeps the current points of versions an edit is about to replace, as history: copies
    /// that searches of the present never see and searches as of an earlier time
    /// ([`Scope::as_of`]) do. A point already replaced (a redelivered edit) is left alone.
    async fn keep_versions(
        &self,
        tenant: &TenantId,
        versions: &[ReplacedVersion],
    ) -> Result<(), StoreError>;

    /// Late interaction: the MaxSim of `question`'s token vectors against each given current
    /// turn's (the mean over the question's tokens of each one's best cosine among the turn's;
    /// tenant-checked). Turns without token vectors, and every turn of an index opened without
    /// a width for them, are left out.
    async fn late_scores(
        &self,
        tenant: &TenantId,
        question: &TokenVectors,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError>;

    /// Late interaction confined to a sentence: for each given current turn stored with its
    /// token rows' sentences, [`TokenVectors::sentence_max_sim`] of `question` (tenant-checked).
    /// Turns stored without them, and an index that cannot read them, are left out.
    async fn sentence_scores(
        &self,
        _tenant: &TenantId,
        _question: &TokenVectors,
        _ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        Ok(HashMap::new())
    }

    /// Dense field vectors of earlier versions, by memory id and the version's `recorded_at`
    /// (tenant-checked; versions not kept are skipped).
    async fn version_vectors(
        &self,
        tenant: &TenantId,
        versions: &[(MemoryId, DateTime<Utc>)],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError>;

    /// Upserts a conversation's keyword vectors (idempotent on tenant, conversation, keyword).
    async fn upsert_keywords(
        &self,
        tenant: &TenantId,
        conversation: &str,
        keywords: Vec<KeywordVector>,
    ) -> Result<(), StoreError> {
        self.upsert_keyword_sets(vec![KeywordSet {
            tenant: tenant.clone(),
            conversation: conversation.to_string(),
            keywords,
        }])
        .await
    }

    /// The keyword vectors of several conversations at once (a writer's batch), with
    /// [`VectorIndex::upsert_keywords`]'s meaning. A keyword a conversation already has may be
    /// left as it is: the same keyword has the same vector.
    async fn upsert_keyword_sets(&self, sets: Vec<KeywordSet>) -> Result<(), StoreError>;

    /// Keywords of the scope's conversations nearest to `vector` with cosine ≥ `min_score`
    /// (name, score). Keywords belong to conversations: the turn filter does not apply.
    async fn search_keywords(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        vector: &[f32],
        limit: usize,
        min_score: f32,
    ) -> Result<Vec<(String, f32)>, StoreError>;

    /// [`VectorIndex::search_keywords`] for several query vectors at once: one list per vector,
    /// in their order. Recall asks for every keyword of a question together, so an index that
    /// scans its keywords (the embedded one) reads each of them once, not once per vector.
    async fn search_keywords_many(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        vectors: &[Vec<f32>],
        limit: usize,
        min_score: f32,
    ) -> Result<Vec<Vec<(String, f32)>>, StoreError> {
        futures::future::try_join_all(
            vectors
                .iter()
                .map(|v| self.search_keywords(tenant, scope, v, limit, min_score)),
        )
        .await
    }

    /// Removes every turn point (kept versions too) and keyword point of a conversation;
    /// returns current turn points removed.
    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError>;

    /// Removes the given turn points (every kept version too) and the conversation's points
    /// of the given keywords (a writer undoing what it wrote for erased turns). Memory ids derive from the tenant, so
    /// ids are never another tenant's.
    async fn delete_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        ids: &[MemoryId],
        keywords: &[String],
    ) -> Result<(), StoreError>;

    /// Turn points in scope.
    async fn count(&self, tenant: &TenantId, scope: &Scope) -> Result<u64, StoreError>;

    /// Copies the index's files to `dir` as one consistent whole (a backup), holding off its
    /// own writes and background work meanwhile. False when it keeps no files of its own here
    /// (a server, backed up with its own tools).
    async fn copy_files_to(&self, _dir: &std::path::Path) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Makes every turn and keyword upsert returned so far durable. Only an index opened to
    /// defer its flushes has anything to do here: one flush then covers every write since
    /// the last (a group commit); the others are durable when each write returns.
    async fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Background maintenance (index building); never required for correctness.
    async fn optimize(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> MemoryId {
        MemoryId([n; 16])
    }

    #[test]
    fn ties_are_settled_by_id_and_a_full_search_ending_on_the_cut_asks_again() {
        let found = vec![(id(9), 2.0), (id(7), 1.0), (id(3), 1.0), (id(5), 1.0)];
        // Asked for 4, given 4, the last tied with the second kept: more may tie.
        assert_eq!(settle_ties(found.clone(), 2, [1.0]), None);
        // Everything there was (no search came back full): the smaller ids win the tie.
        assert_eq!(
            settle_ties(found.clone(), 2, []),
            Some(vec![(id(9), 2.0), (id(3), 1.0)])
        );
        // A full search ending below the cut left nothing out that ties with it.
        assert_eq!(
            settle_ties(found.clone(), 1, [1.0]),
            Some(vec![(id(9), 2.0)])
        );
        // Fewer found than the limit: all of them, in order.
        assert_eq!(
            settle_ties(found, 9, []),
            Some(vec![(id(9), 2.0), (id(3), 1.0), (id(5), 1.0), (id(7), 1.0)])
        );
    }

    /// An engine holding eight points tied at 1.0 below one at 2.0, meeting the tied ones
    /// largest id first: asked for `n`, it returns its first `n` in that order.
    async fn engine(
        asks: &std::sync::Mutex<Vec<usize>>,
        n: usize,
    ) -> Result<Vec<EngineHits>, StoreError> {
        asks.lock().unwrap().push(n);
        let points = std::iter::once((Some(id(99)), 2.0))
            .chain((1..=8).rev().map(|i| (Some(id(i)), 1.0)))
            .take(n)
            .collect();
        Ok(vec![points])
    }

    #[tokio::test]
    async fn a_search_asks_again_until_no_tie_crosses_its_limit() {
        let asks = std::sync::Mutex::new(vec![]);
        let best = search_settling_ties(3, |n| engine(&asks, n)).await.unwrap();
        assert_eq!(best, vec![(id(99), 2.0), (id(1), 1.0), (id(2), 1.0)]);
        // 4 and 8 come back full and end on the tie; 16 finds all nine points.
        assert_eq!(*asks.lock().unwrap(), vec![4, 8, 16]);

        let asks = std::sync::Mutex::new(vec![]);
        let best = search_settling_ties(1, |n| engine(&asks, n)).await.unwrap();
        assert_eq!(best, vec![(id(99), 2.0)]);
        assert_eq!(*asks.lock().unwrap(), vec![2], "the cut is above every tie");

        // A limit the engine cannot be asked beyond still ends.
        let asks = std::sync::Mutex::new(vec![]);
        let best = search_settling_ties(usize::MAX, |n| engine(&asks, n))
            .await
            .unwrap();
        assert_eq!(best.len(), 9);
    }

    #[tokio::test]
    async fn a_point_naming_no_memory_still_counts_toward_a_full_search() {
        // Asked for 3, the engine gives 3, the last naming no memory but tied with the cut:
        // the search is full, so it asks again.
        let asks = std::sync::Mutex::new(vec![]);
        let best = search_settling_ties(2, |n| {
            asks.lock().unwrap().push(n);
            let mut points: EngineHits = vec![(Some(id(9)), 2.0), (Some(id(7)), 1.0), (None, 1.0)];
            points.extend((0..n.saturating_sub(3)).map(|_| (None, 0.5)));
            points.truncate(n);
            std::future::ready(Ok(vec![points]))
        })
        .await
        .unwrap();
        assert_eq!(best, vec![(id(9), 2.0), (id(7), 1.0)]);
        assert_eq!(*asks.lock().unwrap(), vec![3, 6]);
    }

    /// An engine meeting `game` in 41 conversations at 0.9 before the other keywords, then
    /// `a`..`h` tied at 0.5: asked for `n`, its first `n` points.
    fn keyword_engine(asks: &std::sync::Mutex<Vec<usize>>, n: usize) -> KeywordPoints {
        asks.lock().unwrap().push(n);
        std::iter::repeat_n((Some("game".to_string()), 0.9), 41)
            .chain([(None, 0.8), (Some("sport".to_string()), 0.7)])
            .chain(('a'..='h').rev().map(|c| (Some(c.to_string()), 0.5)))
            .take(n)
            .collect()
    }

    #[tokio::test]
    async fn keyword_names_ask_again_past_a_keyword_repeated_across_conversations() {
        let asks = std::sync::Mutex::new(vec![]);
        let names = search_keyword_names(2, |n| std::future::ready(Ok(keyword_engine(&asks, n))))
            .await
            .unwrap();
        assert_eq!(names, vec![("game".into(), 0.9), ("sport".into(), 0.7)]);
        // 8 and 32 points name only `game`; 128 holds everything.
        assert_eq!(*asks.lock().unwrap(), vec![8, 32, 128]);
    }

    #[tokio::test]
    async fn keyword_names_settle_a_tie_across_the_limit_by_name() {
        // Asked for 3 names: 12 points name only `game`.
        let asks = std::sync::Mutex::new(vec![]);
        let names = search_keyword_names(3, |n| std::future::ready(Ok(keyword_engine(&asks, n))))
            .await
            .unwrap();
        assert_eq!(
            names,
            vec![
                ("game".into(), 0.9),
                ("sport".into(), 0.7),
                ("a".into(), 0.5)
            ]
        );
        // 48 points reach `h` to `d`, and `d` is kept at the score they end on, so `a` to `c`
        // may be missing; 192 hold all 51.
        assert_eq!(*asks.lock().unwrap(), vec![12, 48, 192]);
    }

    #[tokio::test]
    async fn keyword_names_keep_a_name_at_its_best_form_and_stop_when_not_full() {
        let names = search_keyword_names(5, |_| {
            std::future::ready(Ok(vec![
                (Some("game".to_string()), 0.9),
                (Some("game".to_string()), 0.95),
                (Some("cat".to_string()), 0.2),
            ]))
        })
        .await
        .unwrap();
        assert_eq!(names, vec![("game".into(), 0.95), ("cat".into(), 0.2)]);
        let none = search_keyword_names(0, |_| async { unreachable!("a limit of 0 asks nothing") })
            .await
            .unwrap();
        assert!(none.is_empty());
    }
}
