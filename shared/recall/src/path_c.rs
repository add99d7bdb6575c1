//! Path C, fragments (KeyMem §1 Phase 2): Fragments reached from the turns Path B's lookups found
//! are scored by SoftTF-IDF against the query keywords; the best ten are expanded into their turns.

use std::collections::{HashMap, HashSet};

use recollect_model::{MemoryId, TenantId};
use recollect_storage::{Scope, TurnRecord};

use crate::softtfidf;
use crate::{PathB, Recall, RecallError};

#[derive(Debug, Default, Clone)]
pub struct PathC {
    /// Turns of the expanded fragments.
    pub turns: HashSet<MemoryId>,
    /// SoftTF-IDF of every candidate fragment.
    pub fragment_score: HashMap<String, f32>,
    /// Best expanded-fragment score per turn (`s_frag`).
    pub turn_score: HashMap<MemoryId, f32>,
    /// The records of the reached turns it read, as stored (Phase 3 takes them rather than
    /// reading them again).
    pub records: HashMap<MemoryId, TurnRecord>,
}

pub async fn run(
    r: &Recall,
    tenant: &TenantId,
    scope: &Scope,
    b: &PathB,
) -> Result<PathC, RecallError> {
    if b.reached.is_empty() || b.neighbours.is_empty() {
        return Ok(PathC::default());
    }
    // The fragments of the best-reached turns: a long conversation's keyword neighbours reach
    // most of it, and reading every reached turn made Path C grow with the conversation.
    let ids: Vec<MemoryId> = b
        .reached
        .iter()
        .take(r.config.path_depth)
        .copied()
        .collect();
    let records = r.graph.turns(tenant, &ids).await?;
    let mut frag_ids: Vec<String> = records
        .iter()
        .flat_map(|rec| rec.fragments.iter().cloned())
        .collect();
    frag_ids.sort();
    frag_ids.dedup();
    let mut fragments = r.graph.fragments(tenant, &frag_ids).await?;
    // As of an earlier time: only the fragments made by then.
    if let Some(at) = scope.as_of {
        fragments.retain(|f| f.created_at <= at);
    }
    let mut scored: Vec<(f32, usize)> = fragments
        .iter()
        .enumerate()
        .map(|(i, f)| {
            (
                softtfidf::score(&b.neighbours, f.keywords.iter(), &b.idf),
                i,
            )
        })
        .filter(|(s, _)| *s > 0.0)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut out = PathC {
        records: records
            .into_iter()
            .map(|rec| (rec.turn.memory_id, rec))
            .collect(),
        ..PathC::default()
    };
    for &(s, i) in &scored {
        out.fragment_score.insert(fragments[i].id.clone(), s);
    }
    for &(s, i) in scored.iter().take(r.config.fragments_expanded) {
        for m in &fragments[i].members {
            out.turns.insert(*m);
            let e = out.turn_score.entry(*m).or_insert(0.0);
            *e = e.max(s);
        }
    }
    Ok(out)
}
