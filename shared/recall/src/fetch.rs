//! Phase 3's store reads, all in one step: the candidate turns every retriever returned, as
//! the recall's scope sees them (the version current at `as_of`, the turn filter applied),
//! with their field vectors and what each retriever said about them. What comes back is plain
//! data: KeyMem scoring ([`crate::keymem`]) and the fusion ([`crate::fuse`]) read nothing else.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use recollect_model::{MemoryId, TenantId, TimeRef, Turn};
use recollect_storage::vector::FieldVectors;
use recollect_storage::{GraphRead, Scope, TurnRecord, VectorIndex};

use crate::{PathB, PathC, RecallError};

/// What Phase 2 retrieved: Path B, Path C, and the dense and BM25 retrievers' scores.
#[derive(Debug, Default, Clone)]
pub struct Retrieved {
    pub b: PathB,
    pub c: PathC,
    /// Best field cosine per turn from dense retrieval.
    pub dense: HashMap<MemoryId, f32>,
    /// BM25 score per turn.
    pub lexical: HashMap<MemoryId, f32>,
    /// Late-interaction MaxSim per turn, from the late retriever (`recall.late_candidates`).
    pub late: HashMap<MemoryId, f32>,
}

/// Which retrievers returned a candidate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Found {
    /// Path B's result (after the intersection filter).
    pub path_b: bool,
    /// A turn of one of Path C's expanded fragments.
    pub path_c: bool,
    pub dense: bool,
    pub lexical: bool,
    /// Among the late retriever's best.
    pub late: bool,
}

/// One candidate turn, as recall's scope sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub turn: Turn,
    /// Stemmed keys of its keywords (what `s_kw` matches against).
    pub keywords: Vec<String>,
    /// The keywords' words as the turn says them, in the same order (the category term looks
    /// for them in the named speaker's field).
    pub keyword_texts: Vec<String>,
    /// The times its text states.
    pub times: Vec<TimeRef>,
    /// Its dense field vectors; None when the index holds none for it.
    pub vectors: Option<FieldVectors>,
    pub found: Found,
    /// `s_frag`: the best score of an expanded fragment holding it (0 when none does).
    pub fragment_score: f32,
    /// Its BM25 score (0 when BM25 did not return it).
    pub lexical: f32,
}

/// Every candidate of one recall, in the order the graph returned them (ties in the final
/// ranking keep it).
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    pub items: Vec<Candidate>,
    /// The best BM25 score of the retrieval, the normaliser of the lexical term (turns the
    /// scope then drops still count, as they did in the retriever's ranking).
    pub lexical_max: f32,
}

/// Reads the candidates of `retrieved` from the graph and the vector index. The turn records
/// Path C already read are taken from it (`retrieved.c.records` is left empty), not read again.
pub async fn fetch(
    graph: &dyn GraphRead,
    vectors: &dyn VectorIndex,
    tenant: &TenantId,
    scope: &Scope,
    retrieved: &mut Retrieved,
) -> Result<Candidates, RecallError> {
    let mut known = std::mem::take(&mut retrieved.c.records);
    let Retrieved {
        b,
        c,
        dense,
        lexical,
        late,
    } = &*retrieved;
    let lexical_max = lexical.values().copied().fold(0.0f32, f32::max);
    let mut ids: HashSet<MemoryId> = HashSet::new();
    ids.extend(b.result.iter().copied());
    ids.extend(c.turns.iter().copied());
    ids.extend(dense.keys().copied());
    ids.extend(lexical.keys().copied());
    ids.extend(late.keys().copied());
    if ids.is_empty() {
        return Ok(Candidates {
            items: vec![],
            lexical_max,
        });
    }
    let ids: Vec<MemoryId> = ids.into_iter().collect();
    let unread: Vec<MemoryId> = ids
        .iter()
        .filter(|id| !known.contains_key(id))
        .copied()
        .collect();
    let (read, field_vectors) = tokio::join!(
        graph.turns(tenant, &unread),
        vectors.field_vectors(tenant, &ids)
    );
    let (read, mut field_vectors) = (read?, field_vectors?);
    known.extend(read.into_iter().map(|rec| (rec.turn.memory_id, rec)));
    // In the candidates' order (unknown ids skipped), as one read of them all would give.
    let mut records: Vec<TurnRecord> = ids.iter().filter_map(|id| known.remove(id)).collect();
    // As of an earlier time: each turn as it was then (never one recorded later), with that
    // version's vectors.
    if let Some(at) = scope.as_of {
        records = records.iter().filter_map(|rec| rec.as_of(at)).collect();
        let older: Vec<(MemoryId, DateTime<Utc>)> = records
            .iter()
            .filter(|rec| rec.turn.expired_at.is_some())
            .map(|rec| (rec.turn.memory_id, rec.turn.recorded_at))
            .collect();
        if !older.is_empty() {
            for id in older.iter().map(|(m, _)| m) {
                field_vectors.remove(id);
            }
            field_vectors.extend(vectors.version_vectors(tenant, &older).await?);
        }
    }
    // The graph paths reach turns through conversation-level nodes: the turn filter applies
    // here, before any scoring, as the vector index applied it inside its searches.
    let filter = &scope.filter;
    if !filter.is_empty() {
        records.retain(|rec| filter.matches(&rec.turn));
    }
    let items = records
        .into_iter()
        .map(|rec| {
            let id = rec.turn.memory_id;
            let (keywords, keyword_texts) = rec
                .extraction
                .keywords
                .into_iter()
                .map(|k| (k.key, k.text))
                .unzip();
            Candidate {
                keywords,
                keyword_texts,
                times: rec.extraction.times,
                vectors: field_vectors.get(&id).cloned(),
                found: Found {
                    path_b: b.result.contains(&id),
                    path_c: c.turns.contains(&id),
                    dense: dense.contains_key(&id),
                    lexical: lexical.contains_key(&id),
                    late: late.contains_key(&id),
                },
                fragment_score: c.turn_score.get(&id).copied().unwrap_or(0.0),
                lexical: lexical.get(&id).copied().unwrap_or(0.0),
                turn: rec.turn,
            }
        })
        .collect();
    Ok(Candidates { items, lexical_max })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{point, turn};
    use chrono::TimeZone;
    use recollect_model::{Extraction, Keyword};
    use recollect_storage::{EdgeVectorIndex, EmbeddedGraph, Graph};

    /// Two stored turns (t1: keyword "dog", a time, both field vectors; t2: spoken by Cy, the
    /// user vector only) and a retrieval that reached them and one unknown id.
    async fn seeded(
        dir: &std::path::Path,
    ) -> (EmbeddedGraph, EdgeVectorIndex, [Turn; 2], Retrieved) {
        let graph = EmbeddedGraph::open(&dir.join("g.redb")).unwrap();
        let vectors = EdgeVectorIndex::open(&dir.join("v"), 4).unwrap();
        let t1 = turn("a", 1);
        let mut t2 = turn("a", 2);
        t2.user_speaker = Some("Cy".into());
        let day = chrono::NaiveDate::from_ymd_opt(2023, 5, 8).unwrap();
        let x1 = Extraction {
            keywords: vec![Keyword {
                key: "dog".into(),
                text: "dogs".into(),
            }],
            times: vec![TimeRef {
                text: "today".into(),
                start: day,
                end: day,
                granularity: "day".into(),
            }],
            extractor: "rules".into(),
            ..Default::default()
        };
        graph
            .write_turns(&[(t1.clone(), x1), (t2.clone(), Extraction::default())])
            .await
            .unwrap();
        vectors
            .upsert_turns(vec![
                point(
                    &t1,
                    vec![1.0, 0.0, 0.0, 0.0],
                    Some(vec![0.0, 1.0, 0.0, 0.0]),
                ),
                point(&t2, vec![0.0, 0.0, 1.0, 0.0], None),
            ])
            .await
            .unwrap();
        let ghost = MemoryId::derive(&t1.tenant, "a", "never stored");
        let mut retrieved = Retrieved::default();
        retrieved.b.result.insert(t1.memory_id);
        retrieved.c.turns.insert(t2.memory_id);
        retrieved.c.turn_score.insert(t2.memory_id, 2.5);
        retrieved.dense.insert(t1.memory_id, 0.7);
        retrieved.lexical.insert(t2.memory_id, 3.0);
        retrieved.lexical.insert(ghost, 6.0);
        (graph, vectors, [t1, t2], retrieved)
    }

    #[tokio::test]
    async fn fetch_reads_every_candidate_with_what_each_retriever_said() {
        let dir = tempfile::tempdir().unwrap();
        let (graph, vectors, [t1, t2], mut retrieved) = seeded(dir.path()).await;
        let tenant = t1.tenant.clone();
        let got = fetch(&graph, &vectors, &tenant, &Scope::all(), &mut retrieved)
            .await
            .unwrap();
        assert_eq!(
            got.lexical_max, 6.0,
            "the unknown id's BM25 score still normalises"
        );
        assert_eq!(got.items.len(), 2, "the unknown id is skipped");
        let one = got
            .items
            .iter()
            .find(|c| c.turn.memory_id == t1.memory_id)
            .unwrap();
        assert_eq!(one.turn.user, t1.user);
        assert_eq!(one.keywords, vec!["dog".to_string()]);
        assert_eq!(one.times.len(), 1);
        assert_eq!(
            one.vectors,
            Some(FieldVectors {
                user: vec![1.0, 0.0, 0.0, 0.0],
                assistant: Some(vec![0.0, 1.0, 0.0, 0.0]),
            })
        );
        assert_eq!(
            one.found,
            Found {
                path_b: true,
                dense: true,
                ..Found::default()
            }
        );
        assert_eq!((one.fragment_score, one.lexical), (0.0, 0.0));
        let two = got
            .items
            .iter()
            .find(|c| c.turn.memory_id == t2.memory_id)
            .unwrap();
        assert_eq!(
            two.found,
            Found {
                path_c: true,
                lexical: true,
                ..Found::default()
            }
        );
        assert_eq!((two.fragment_score, two.lexical), (2.5, 3.0));
        assert_eq!(
            two.vectors.as_ref().map(|v| v.assistant.is_none()),
            Some(true)
        );
    }

    #[tokio::test]
    async fn fetch_applies_the_scopes_turn_filter_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let (graph, vectors, [t1, t2], mut retrieved) = seeded(dir.path()).await;
        let tenant = t1.tenant.clone();
        let mut scope = Scope::all();
        scope.filter.speakers = vec!["Cy".into()];
        let got = fetch(&graph, &vectors, &tenant, &scope, &mut retrieved)
            .await
            .unwrap();
        let ids: Vec<MemoryId> = got.items.iter().map(|c| c.turn.memory_id).collect();
        assert_eq!(ids, vec![t2.memory_id]);
        // Before either turn was recorded: nothing, though BM25's maximum stays.
        let before = Scope {
            as_of: Some(Utc.with_ymd_and_hms(2023, 12, 1, 0, 0, 0).unwrap()),
            ..Scope::all()
        };
        let got = fetch(&graph, &vectors, &tenant, &before, &mut retrieved)
            .await
            .unwrap();
        assert!(got.items.is_empty());
        assert_eq!(got.lexical_max, 6.0);
        let none = fetch(
            &graph,
            &vectors,
            &tenant,
            &Scope::all(),
            &mut Retrieved::default(),
        )
        .await
        .unwrap();
        assert!(none.items.is_empty() && none.lexical_max == 0.0);
    }

    #[tokio::test]
    async fn fetch_as_of_an_earlier_time_reads_that_versions_text_and_vectors() {
        let dir = tempfile::tempdir().unwrap();
        let (graph, vectors, [t1, _], retrieved) = seeded(dir.path()).await;
        let tenant = t1.tenant.clone();
        let edited_at = Utc.with_ymd_and_hms(2024, 2, 1, 0, 0, 0).unwrap();
        let patch = recollect_model::TurnPatch {
            user: Some("edited text".into()),
            ..Default::default()
        };
        let v2 = patch.apply(&t1, edited_at).unwrap();
        graph
            .write_turns(&[(v2.clone(), Extraction::default())])
            .await
            .unwrap();
        let replaced = recollect_storage::vector::ReplacedVersion {
            memory_id: t1.memory_id,
            recorded_at: t1.recorded_at,
            expired_at: edited_at,
        };
        vectors.keep_versions(&tenant, &[replaced]).await.unwrap();
        vectors
            .upsert_turns(vec![point(&v2, vec![0.0, 0.0, 0.0, 1.0], None)])
            .await
            .unwrap();
        let of = |scope: Scope| {
            let (graph, vectors, tenant) = (&graph, &vectors, &tenant);
            let mut retrieved = retrieved.clone();
            async move {
                let got = fetch(graph, vectors, tenant, &scope, &mut retrieved)
                    .await
                    .unwrap();
                got.items
                    .into_iter()
                    .find(|c| c.turn.memory_id == t1.memory_id)
                    .unwrap()
            }
        };
        let now = of(Scope::all()).await;
        assert_eq!(now.turn.user, "edited text");
        assert!(now.keywords.is_empty());
        assert_eq!(now.vectors.unwrap().user, vec![0.0, 0.0, 0.0, 1.0]);
        let then = of(Scope {
            as_of: Some(Utc.with_ymd_and_hms(2024, 1, 15, 0, 0, 0).unwrap()),
            ..Scope::all()
        })
        .await;
        assert_eq!(then.turn.user, t1.user);
        assert_eq!(then.keywords, vec!["dog".to_string()]);
        assert_eq!(then.vectors.unwrap().user, vec![1.0, 0.0, 0.0, 0.0]);
    }

    #[tokio::test]
    async fn records_path_c_read_are_taken_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let (graph, vectors, [t1, t2], mut retrieved) = seeded(dir.path()).await;
        let tenant = t1.tenant.clone();
        // A record Path C read, marked so that a second read from the graph would show.
        let mut read = graph.turns(&tenant, &[t2.memory_id]).await.unwrap();
        read[0].turn.user = "as Path C read it".into();
        retrieved
            .c
            .records
            .insert(t2.memory_id, read.pop().unwrap());
        let got = fetch(&graph, &vectors, &tenant, &Scope::all(), &mut retrieved)
            .await
            .unwrap();
        assert!(retrieved.c.records.is_empty(), "taken");
        let user_of = |id| {
            got.items
                .iter()
                .find(|c| c.turn.memory_id == id)
                .map(|c| c.turn.user.clone())
        };
        assert_eq!(user_of(t2.memory_id).as_deref(), Some("as Path C read it"));
        assert_eq!(
            user_of(t1.memory_id),
            Some(t1.user.clone()),
            "the rest read"
        );
    }
}
