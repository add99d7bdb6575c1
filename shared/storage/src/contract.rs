//! The contract every `Graph` and `VectorIndex` implementation passes, written once. Embedded
//! stores run it in their unit tests; production adapters run the same functions against real
//! servers.

use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use recollect_model::{
    Extraction, Fragment, Keyword, KeywordVector, MemoryId, Segment, SparseVector, TenantId,
    TimeRef, TokenVectors, Turn,
};

use futures::future::BoxFuture;

use crate::graph::{ConversationState, TurnErasure};
use crate::vector::{KeywordSet, ReplacedVersion, TurnPoint, VectorField, VectorQuery};
use crate::{Graph, NodeKind, Scope, StoreError, VectorIndex};

/// Counts what a backend still holds of a tenant's conversation, by querying it directly (not
/// through the trait), so erasure is checked on the data itself.
pub type Residue = Arc<dyn Fn(TenantId, String) -> BoxFuture<'static, u64> + Send + Sync>;

fn turn(tenant: &TenantId, conv: &str, pos: u64, text: &str) -> Turn {
    let id = pos.to_string();
    Turn {
        memory_id: MemoryId::derive(tenant, conv, &id),
        tenant: tenant.clone(),
        conversation_id: conv.into(),
        turn_id: id,
        position: pos,
        user: text.into(),
        assistant: format!("reply to {text}"),
        user_speaker: Some("Zoë \"Z\" O'Neil".into()),
        assistant_speaker: Some("Bot".into()),
        timestamp: Utc.with_ymd_and_hms(2023, 5, 8, 12, 0, 0).unwrap()
            + Duration::minutes(pos as i64),
        recorded_at: Utc::now(),
        metadata: Default::default(),
        user_id: None,
        agent_id: None,
        version: 1,
        first_recorded_at: None,
        expired_at: None,
    }
}

fn extraction(words: &[&str], entity: &str, day: u32) -> Extraction {
    let d = chrono::NaiveDate::from_ymd_opt(2023, 5, day).unwrap();
    Extraction {
        keywords: words
            .iter()
            .map(|w| Keyword {
                key: w.to_string(),
                text: w.to_string(),
            })
            .collect(),
        entities: vec![entity.to_string()],
        locations: vec!["Café \"Zürich\"".into()],
        times: vec![TimeRef {
            text: "that day".into(),
            start: d,
            end: d,
            granularity: "day".into(),
        }],
        event_time: Some(Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).unwrap())),
        extractor: "rules".into(),
        ..Default::default()
    }
}

fn unit(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
    v.iter_mut().for_each(|x| *x /= n);
}

/// Turn 0 of conversation "c" with an 8-dimensional user vector and nothing else.
#[cfg(test)]
fn first_point(t: &TenantId) -> TurnPoint {
    TurnPoint {
        memory_id: MemoryId::derive(t, "c", "0"),
        tenant: t.clone(),
        conversation_id: "c".into(),
        turn_id: "0".into(),
        position: 0,
        timestamp: Utc::now(),
        user_speaker: None,
        assistant_speaker: None,
        user: vector(8, 1),
        assistant: None,
        lexical: SparseVector::default(),
        user_id: None,
        agent_id: None,
        metadata: Default::default(),
        recorded_at: chrono::Utc::now(),
        late: None,
    }
}

fn vector(dim: usize, seed: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..dim)
        .map(|i| (((i * 31 + seed * 17) % 23) as f32) - 11.0)
        .collect();
    unit(&mut v);
    v
}

/// Graph contract: idempotent writes, tenant isolation, scoped lookups, as-of reads, erasure,
/// batch sizes, unicode and quotes everywhere, concurrent writers.
pub async fn graph_contract(g: Arc<dyn Graph>, residue: Residue) {
    graph_semantics(g.clone(), residue.clone()).await;
    graph_unicode(g.clone(), residue.clone()).await;
    graph_erasure(g.clone(), residue.clone()).await;
    graph_participants(g.clone()).await;
    graph_listing_pages(g.clone()).await;
    graph_turn_erasure(g.clone()).await;
    graph_versions(g.clone(), residue.clone()).await;
    graph_restart(g.clone(), residue.clone()).await;
    graph_consolidation(g.clone(), residue.clone()).await;
    graph_batch_sizes(g, residue).await;
}

/// The conversation listing a page at a time: ids in byte order (a prefix before what extends
/// it), strictly after the cursor, at most `limit`, the tenant's own only.
async fn graph_listing_pages(g: Arc<dyn Graph>) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let t = TenantId(format!("tenant-pages-{run}"));
    let other = TenantId(format!("tenant-pages-other-{run}"));
    for (tenant, c) in [
        (&t, "b"),
        (&t, "ab"),
        (&t, "a"),
        (&t, "c"),
        (&t, "Z"),
        (&t, "é"),
        (&t, "😀"),
        (&t, "！"),
        (&other, "aa"),
    ] {
        g.write_turns(&[(turn(tenant, c, 0, "hello"), extraction(&["hi"], "Zoë", 1))])
            .await
            .unwrap();
    }
    let page = |after: Option<&'static str>, limit: usize| {
        let (g, t) = (g.clone(), t.clone());
        async move { g.conversations_after(&t, after, limit).await.unwrap() }
    };
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(page(None, 2).await, ids(&["Z", "a"]));
    assert_eq!(page(Some("a"), 2).await, ids(&["ab", "b"]));
    assert_eq!(
        page(Some("aa"), 10).await,
        ids(&["ab", "b", "c", "é", "！", "😀"]),
        "a cursor need not exist"
    );
    // Code point order past ASCII too (UTF-16's would put the emoji before the fullwidth "！").
    assert_eq!(page(Some("c"), 10).await, ids(&["é", "！", "😀"]));
    assert_eq!(page(Some("！"), 10).await, ids(&["😀"]));
    assert_eq!(page(Some("😀"), 10).await, ids(&[]));
    assert_eq!(page(None, 0).await, ids(&[]));
    assert_eq!(page(None, 100).await, g.conversations(&t).await.unwrap());
    for c in ["a", "ab", "b", "c", "Z", "é", "😀", "！"] {
        g.delete_conversation(&t, c).await.unwrap();
    }
    g.delete_conversation(&other, "aa").await.unwrap();
    assert!(page(None, 10).await.is_empty());
}

/// A consolidation pass of several conversations in one call: every fragment is written and
/// linked from its members, each conversation's `consolidated_until` moves forward (never
/// back) and the rest of its state stays; a conversation advanced without fragments and an
/// empty call are fine.
async fn graph_consolidation(g: Arc<dyn Graph>, residue: Residue) {
    let t = TenantId("tenant-consolidation".into());
    let other = TenantId("tenant-consolidation-2".into());
    let mut fragments = Vec::new();
    for (tenant, conv) in [(&t, "a"), (&t, "b"), (&other, "a")] {
        let turns: Vec<(Turn, Extraction)> = (0..4)
            .map(|i| {
                (
                    turn(tenant, conv, i, &format!("the glaze, part {i}")),
                    extraction(&["glaze"], "Zoë", 1),
                )
            })
            .collect();
        g.write_turns(&turns).await.unwrap();
        let mut st = g.conversation_state(tenant, conv).await.unwrap();
        st.next_position = 4;
        st.reference.entities.push("Zoë".into());
        assert!(g.save_conversation_state(tenant, conv, &st).await.unwrap());
        for (n, members) in [&turns[..2], &turns[2..]].into_iter().enumerate() {
            fragments.push(Fragment {
                id: format!("frag-{conv}-{n}"),
                tenant: tenant.clone(),
                conversation_id: conv.into(),
                description: "glazes".into(),
                members: members.iter().map(|(t, _)| t.memory_id).collect(),
                keywords: vec!["glaze".into()],
                created_at: Utc::now(),
            });
        }
    }
    g.write_consolidation(
        fragments,
        vec![
            (t.clone(), "a".into(), 4),
            (t.clone(), "b".into(), 4),
            (other.clone(), "a".into(), 4),
            (t.clone(), "no-fragments".into(), 10),
        ],
    )
    .await
    .unwrap();
    for (tenant, conv) in [(&t, "a"), (&t, "b"), (&other, "a")] {
        let ids = [format!("frag-{conv}-0"), format!("frag-{conv}-1")];
        let frags = g.fragments(tenant, &ids).await.unwrap();
        assert_eq!(frags.len(), 2, "{tenant:?} {conv}");
        let recs = g
            .conversation_turns(tenant, conv, 0, u64::MAX)
            .await
            .unwrap();
        let linked: Vec<Vec<String>> = recs.iter().map(|r| r.fragments.clone()).collect();
        assert_eq!(
            linked,
            [&ids[0], &ids[0], &ids[1], &ids[1]].map(|f| vec![f.clone()]),
            "{tenant:?} {conv}"
        );
        let st = g.conversation_state(tenant, conv).await.unwrap();
        assert_eq!(
            (
                st.consolidated_until,
                st.next_position,
                st.reference.entities.len()
            ),
            (4, 4, 1),
            "{tenant:?} {conv}"
        );
    }
    assert_eq!(
        g.conversation_state(&t, "no-fragments")
            .await
            .unwrap()
            .consolidated_until,
        10
    );
    // Never back; and a call with nothing in it changes nothing.
    g.write_consolidation(Vec::new(), vec![(t.clone(), "a".into(), 2)])
        .await
        .unwrap();
    g.write_consolidation(Vec::new(), Vec::new()).await.unwrap();
    assert_eq!(
        g.conversation_state(&t, "a")
            .await
            .unwrap()
            .consolidated_until,
        4
    );
    for (tenant, conv) in [(&t, "a"), (&t, "b"), (&other, "a")] {
        assert_eq!(g.delete_conversation(tenant, conv).await.unwrap(), 4);
        assert_eq!(residue(tenant.clone(), conv.into()).await, 0, "{conv}");
    }
    assert_eq!(g.delete_conversation(&t, "no-fragments").await.unwrap(), 0);
    assert_eq!(residue(t.clone(), "no-fragments".into()).await, 0);
}

/// A reindex's restart of one conversation: its fragments and derived state go, its positions
/// stay; its turns stay (recall goes on), each marked rederiving until it is written again.
/// Another conversation is untouched.
async fn graph_restart(g: Arc<dyn Graph>, residue: Residue) {
    let t = TenantId("tenant-restart".into());
    let batch = |conv: &str| -> Vec<(Turn, Extraction)> {
        (0..3)
            .map(|i| {
                (
                    turn(&t, conv, i, &format!("the kiln, part {i}")),
                    extraction(&["kiln"], "Zoë", 1),
                )
            })
            .collect()
    };
    for conv in ["r", "other"] {
        let turns = batch(conv);
        g.write_turns(&turns).await.unwrap();
        g.write_fragments(&[Fragment {
            id: format!("frag-{conv}"),
            tenant: t.clone(),
            conversation_id: conv.into(),
            description: "kilns".into(),
            members: turns.iter().map(|(t, _)| t.memory_id).collect(),
            keywords: vec!["kiln".into()],
            created_at: Utc::now(),
        }])
        .await
        .unwrap();
        let mut st = g.conversation_state(&t, conv).await.unwrap();
        st.next_position = 3;
        st.reference.entities.push("Zoë".into());
        g.save_conversation_state(&t, conv, &st).await.unwrap();
        g.advance_consolidated_until(&t, conv, 10).await.unwrap();
    }
    g.restart_derivation(&t, "r").await.unwrap();

    let recs = g.conversation_turns(&t, "r", 0, u64::MAX).await.unwrap();
    assert_eq!(recs.len(), 3);
    for r in &recs {
        assert!(r.rederiving, "turn {}", r.turn.position);
        assert!(r.fragments.is_empty(), "turn {}", r.turn.position);
        assert_eq!(r.extraction, extraction(&["kiln"], "Zoë", 1));
    }
    let ids: Vec<MemoryId> = recs.iter().map(|r| r.turn.memory_id).collect();
    assert!(g
        .turns(&t, &ids)
        .await
        .unwrap()
        .iter()
        .all(|r| r.rederiving));
    assert!(g
        .fragments(&t, &["frag-r".into()])
        .await
        .unwrap()
        .is_empty());
    let st = g.conversation_state(&t, "r").await.unwrap();
    assert_eq!(
        (
            st.consolidated_until,
            st.next_position,
            st.reference.entities.len()
        ),
        (0, 3, 0)
    );

    // Written again (a new derivation), a turn is no longer marked; the others wait.
    g.write_turns(&batch("r")[..1]).await.unwrap();
    let recs = g.conversation_turns(&t, "r", 0, u64::MAX).await.unwrap();
    let marks: Vec<bool> = recs.iter().map(|r| r.rederiving).collect();
    assert_eq!(marks, [false, true, true]);

    let other = g
        .conversation_turns(&t, "other", 0, u64::MAX)
        .await
        .unwrap();
    for r in &other {
        assert!(!r.rederiving, "turn {}", r.turn.position);
        assert_eq!(r.fragments, ["frag-other".to_string()]);
    }
    let st = g.conversation_state(&t, "other").await.unwrap();
    assert_eq!(
        (st.consolidated_until, st.reference.entities.len()),
        (10, 1)
    );

    for conv in ["r", "other"] {
        assert_eq!(g.delete_conversation(&t, conv).await.unwrap(), 3);
        assert_eq!(residue(t.clone(), conv.into()).await, 0, "{conv}");
    }
}

/// Edits: a later version supersedes the stored one (kept in the record's history, its lost
/// links expired, not deleted: visible as of earlier times only), a replay of either version
/// and a retried store change nothing, a turn and its edit in one batch are written in order,
/// and purging the memory removes every version, its expired links and what it put in the
/// conversation's state.
async fn graph_versions(g: Arc<dyn Graph>, residue: Residue) {
    let t = TenantId("tenant-versions".into());
    let conv = "v";
    let scope = Scope::of(&[conv]);
    let v1 = turn(&t, conv, 0, "my cat Biscuit");
    let x1 = extraction(&["cat", "shelter"], "Biscuit", 8);
    let other = turn(&t, conv, 1, "other");
    g.write_turns(&[
        (v1.clone(), x1.clone()),
        (other.clone(), extraction(&["shelter"], "Ines", 9)),
    ])
    .await
    .unwrap();
    let mut state = ConversationState::default();
    state.reference.entities = vec!["Biscuit".into(), "Ines".into()];
    state.derived_from(v1.recorded_at);
    assert!(g.save_conversation_state(&t, conv, &state).await.unwrap());
    let before = Utc::now();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let patch = recollect_model::TurnPatch {
        user: Some("my dog Pretzel".into()),
        ..Default::default()
    };
    let v2 = patch.apply(&v1, Utc::now()).unwrap();
    assert_eq!(
        (v2.version, v2.first_recorded_at),
        (2, Some(v1.recorded_at))
    );
    let x2 = extraction(&["dog", "shelter"], "Pretzel", 8);
    // The edit, its replay, and a replay of the first version: one edit applied.
    g.write_turns(&[(v2.clone(), x2.clone())]).await.unwrap();
    g.write_turns(&[(v2.clone(), x2.clone()), (v1.clone(), x1.clone())])
        .await
        .unwrap();
    let rec = g.turns(&t, &[v1.memory_id]).await.unwrap().remove(0);
    assert_eq!(rec.turn.user, "my dog Pretzel");
    assert_eq!(rec.turn.version, 2);
    assert_eq!(rec.history.len(), 1, "{rec:?}");
    assert_eq!(rec.history[0].turn.user, "my cat Biscuit");
    assert_eq!(rec.history[0].turn.expired_at, Some(v2.recorded_at));
    assert_eq!(rec.history[0].extraction, x1);
    assert_eq!(rec.versions().len(), 2);
    assert_eq!(rec.as_of(before).unwrap().turn.user, "my cat Biscuit");
    assert!(rec.as_of(v1.recorded_at - Duration::seconds(1)).is_none());
    let linked = |names: &[&str], at: Option<chrono::DateTime<Utc>>| {
        let g = g.clone();
        let (t, scope) = (t.clone(), scope.clone());
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        async move {
            let mut ids: Vec<MemoryId> = g
                .linked_turns(&t, &scope, NodeKind::Keyword, &names, at, None)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.memory_id)
                .collect();
            ids.sort();
            ids.dedup();
            ids
        }
    };
    // Now: the new keyword, not the lost one; the kept one still links.
    assert_eq!(linked(&["dog"], None).await, vec![v1.memory_id]);
    assert!(
        linked(&["cat"], None).await.is_empty(),
        "a lost link is not current"
    );
    let mut both = vec![v1.memory_id, other.memory_id];
    both.sort();
    assert_eq!(linked(&["shelter"], None).await, both);
    // As of before the edit: the lost link, not the new one.
    assert_eq!(linked(&["cat"], Some(before)).await, vec![v1.memory_id]);
    assert!(linked(&["dog"], Some(before)).await.is_empty());
    assert_eq!(linked(&["shelter"], Some(before)).await, both);
    let mut vocab = g.vocabulary(&t, &scope, NodeKind::Keyword).await.unwrap();
    vocab.sort();
    assert_eq!(
        vocab,
        vec!["dog", "shelter"],
        "the vocabulary is the present's"
    );
    // A retried first store after the edit does not revert it.
    g.write_turns(&[(v1.clone(), x1.clone())]).await.unwrap();
    assert_eq!(
        g.turns(&t, &[v1.memory_id]).await.unwrap()[0].turn.version,
        2
    );

    // A turn and its edit in one batch: both applied, in order.
    let w1 = turn(&t, conv, 2, "first words");
    let w2 = recollect_model::TurnPatch {
        user: Some("second words".into()),
        ..Default::default()
    }
    .apply(&w1, Utc::now())
    .unwrap();
    g.write_turns(&[
        (w1.clone(), extraction(&["first"], "Ines", 9)),
        (w2.clone(), extraction(&["second"], "Ines", 9)),
    ])
    .await
    .unwrap();
    let rec = g.turns(&t, &[w1.memory_id]).await.unwrap().remove(0);
    assert_eq!(
        (rec.turn.user.as_str(), rec.history.len()),
        ("second words", 1)
    );

    // Erasing the edited memory takes every version, its expired links, and its names out
    // of the conversation's state; the others stay.
    let at = Utc::now();
    g.record_turn_erasure(&t, conv, v1.memory_id, TurnErasure { at, position: 0 })
        .await
        .unwrap();
    assert_eq!(g.purge_erased(&t, conv).await.unwrap(), 1);
    assert!(g.turns(&t, &[v1.memory_id]).await.unwrap().is_empty());
    assert!(
        linked(&["cat"], Some(before)).await.is_empty(),
        "expired links go too"
    );
    assert_eq!(linked(&["shelter"], None).await, vec![other.memory_id]);
    let st = g.conversation_state(&t, conv).await.unwrap();
    assert_eq!(st.reference.entities, vec!["Ines".to_string()], "{st:?}");
    // An edit of the erased memory arriving late is covered: it does not bring it back.
    let late = recollect_model::TurnPatch {
        user: Some("late edit".into()),
        ..Default::default()
    }
    .apply(&v2, Utc::now())
    .unwrap();
    g.write_turns(&[(late, x2)]).await.unwrap();
    assert!(g.turns(&t, &[v1.memory_id]).await.unwrap().is_empty());
    g.delete_conversation(&t, conv).await.unwrap();
    assert_eq!(residue(t.clone(), conv.to_string()).await, 0);
}

/// One turn erased on its own: its record is read back with its position, a late write of it
/// is refused, purging removes it, its unshared keywords and its fragments and nothing else of
/// the conversation, and a fresh store of the same id afterwards is a new memory.
async fn graph_turn_erasure(g: Arc<dyn Graph>) {
    let t = TenantId("tenant-turn-erasure".into());
    let conv = "te";
    let pairs: Vec<(Turn, Extraction)> = (0..5u64)
        .map(|i| {
            let words: &[&str] = if i == 1 {
                &["kayak", "zeppelin"]
            } else {
                &["kayak"]
            };
            (
                turn(&t, conv, i, &format!("turn {i}")),
                extraction(words, "Ines", 8),
            )
        })
        .collect();
    g.write_turns(&pairs).await.unwrap();
    let id = |i: usize| pairs[i].0.memory_id;
    let fragment = |fid: &str, members: &[usize]| Fragment {
        id: fid.into(),
        tenant: t.clone(),
        conversation_id: conv.into(),
        description: "kayak, zeppelin".into(),
        members: members.iter().map(|&i| id(i)).collect(),
        keywords: vec!["kayak".into()],
        created_at: Utc::now(),
    };
    g.write_fragments(&[fragment("f1", &[0, 1]), fragment("f2", &[2, 3])])
        .await
        .unwrap();
    let mut state = ConversationState {
        consolidated_until: 4,
        ..Default::default()
    };
    state.derived_from(pairs[0].0.recorded_at);
    // Words enough that a store which compresses long states does so here too.
    let story = "and then the kayak trip along the river before the storm came in ".repeat(3);
    for (turn, _) in &pairs[..3] {
        let said = format!("words of {} {story}", turn.turn_id);
        state.remember_text(turn.position, turn.timestamp, &said, 40);
    }
    assert!(serde_json::to_vec(&state).unwrap().len() > 512);
    assert!(g.save_conversation_state(&t, conv, &state).await.unwrap());

    let at = Utc::now();
    g.record_turn_erasure(&t, conv, id(1), TurnErasure { at, position: 1 })
        .await
        .unwrap();
    let e = g.erasures(&t, &[conv.to_string()]).await.unwrap();
    let rec = e.turns[&id(1)];
    assert_eq!(rec.position, 1);
    assert!((rec.at - at).num_milliseconds().abs() <= 1, "{rec:?}");
    assert!(e.marker(conv).is_none(), "no conversation marker");
    assert!(e.covers_turn(&pairs[1].0) && !e.covers_turn(&pairs[0].0));
    assert_eq!(
        e.erased_positions(0, 10).into_iter().collect::<Vec<_>>(),
        vec![1]
    );
    assert!(e.erased_positions(2, 10).is_empty());
    // Another conversation's erasures do not list it.
    assert!(g
        .erasures(&t, &["other".to_string()])
        .await
        .unwrap()
        .turns
        .is_empty());

    assert_eq!(g.purge_erased(&t, conv).await.unwrap(), 1);
    assert!(g.turns(&t, &[id(1)]).await.unwrap().is_empty());
    let left = g.turns(&t, &[id(0), id(2), id(3), id(4)]).await.unwrap();
    assert_eq!(left.len(), 4, "the rest of the conversation stays");
    assert!(g
        .conversations(&t)
        .await
        .unwrap()
        .contains(&conv.to_string()));
    let vocab = g
        .vocabulary(&t, &Scope::of(&[conv]), NodeKind::Keyword)
        .await
        .unwrap();
    assert_eq!(vocab, vec!["kayak"], "the erased turn's own keyword goes");
    let frags = g.fragments(&t, &["f1".into(), "f2".into()]).await.unwrap();
    assert_eq!(
        frags.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
        vec!["f2"],
        "a fragment quoting the erased turn goes"
    );
    assert_eq!(
        g.conversation_state(&t, conv)
            .await
            .unwrap()
            .consolidated_until,
        4,
        "the conversation's state stays"
    );
    let kept: Vec<u64> = g
        .conversation_state(&t, conv)
        .await
        .unwrap()
        .recent_text
        .iter()
        .map(|r| r.position)
        .collect();
    assert_eq!(
        kept,
        vec![0, 2],
        "the erased turn's words leave the context window"
    );
    assert_eq!(
        g.conversation_turns(&t, conv, 0, 10)
            .await
            .unwrap()
            .iter()
            .map(|r| r.turn.position)
            .collect::<Vec<_>>(),
        vec![0, 2, 3, 4]
    );

    // A late write of the erased turn, and a fragment naming it, are refused.
    g.write_turns(&pairs[1..2]).await.unwrap();
    assert!(g.turns(&t, &[id(1)]).await.unwrap().is_empty());
    g.write_fragments(&[fragment("f3", &[0, 1])]).await.unwrap();
    assert!(g.fragments(&t, &["f3".into()]).await.unwrap().is_empty());

    // Stored again after the erasure: a new memory under the same id.
    let mut again = pairs[1].clone();
    again.0.recorded_at = at + Duration::seconds(1);
    again.0.position = 5;
    g.write_turns(&[again]).await.unwrap();
    assert_eq!(g.turns(&t, &[id(1)]).await.unwrap().len(), 1);
    assert_eq!(g.purge_erased(&t, conv).await.unwrap(), 0);

    // Erasing the conversation takes the turn records along.
    g.record_erasure(&t, Some(conv), Utc::now()).await.unwrap();
    g.delete_conversation(&t, conv).await.unwrap();
    assert!(g
        .erasures(&t, &[conv.to_string()])
        .await
        .unwrap()
        .turns
        .is_empty());
}

/// The conversations of end users and agents: any of the ids, both kinds intersected, other
/// tenants apart, gone with their conversation.
async fn graph_participants(g: Arc<dyn Graph>) {
    let a = TenantId("tenant-participants".into());
    let b = TenantId("tenant-participants-b".into());
    let with = |t: &TenantId, conv: &str, pos: u64, user: Option<&str>, agent: Option<&str>| {
        let mut turn = turn(t, conv, pos, "we talked about kayaks");
        turn.user_id = user.map(String::from);
        turn.agent_id = agent.map(String::from);
        (turn, extraction(&["kayak"], "Ines", 8))
    };
    g.write_turns(&[
        with(&a, "p1", 0, Some("u-1"), Some("agent-x")),
        with(&a, "p1", 1, Some("u-1"), None),
        with(&a, "p2", 0, Some("u-2"), Some("agent-x")),
        with(&a, "p3", 0, Some("u-1"), Some("agent-y")),
        with(&a, "p4", 0, None, None),
        with(&b, "p9", 0, Some("u-1"), None),
    ])
    .await
    .unwrap();
    let of = |u: &[&str], ag: &[&str]| {
        let g = g.clone();
        let a = a.clone();
        let u: Vec<String> = u.iter().map(|s| s.to_string()).collect();
        let ag: Vec<String> = ag.iter().map(|s| s.to_string()).collect();
        async move { g.conversations_of(&a, &u, &ag).await.unwrap() }
    };
    assert_eq!(of(&["u-1"], &[]).await, vec!["p1", "p3"]);
    assert_eq!(of(&["u-1", "u-2"], &[]).await, vec!["p1", "p2", "p3"]);
    assert_eq!(of(&[], &["agent-x"]).await, vec!["p1", "p2"]);
    assert_eq!(of(&["u-1"], &["agent-x"]).await, vec!["p1"]);
    assert!(of(&["nobody"], &[]).await.is_empty());
    assert!(of(&[], &[]).await.is_empty());
    // Idempotent rewrite, then erasure of one conversation.
    g.write_turns(&[with(&a, "p1", 0, Some("u-1"), Some("agent-x"))])
        .await
        .unwrap();
    assert_eq!(of(&["u-1"], &[]).await, vec!["p1", "p3"]);
    g.delete_conversation(&a, "p1").await.unwrap();
    assert_eq!(of(&["u-1"], &[]).await, vec!["p3"]);
    assert_eq!(
        g.conversations_of(&b, &["u-1".into()], &[]).await.unwrap(),
        vec!["p9"]
    );
    for c in ["p2", "p3", "p4"] {
        g.delete_conversation(&a, c).await.unwrap();
    }
    g.delete_conversation(&b, "p9").await.unwrap();
    assert!(of(&["u-1", "u-2"], &["agent-x", "agent-y"])
        .await
        .is_empty());
}

/// A marker read back: equal to the erase time, or up to a microsecond later (servers that keep
/// microseconds round up, never down).
fn assert_marker(got: Option<chrono::DateTime<Utc>>, at: chrono::DateTime<Utc>) {
    let got = got.expect("a marker");
    assert!(
        got >= at && got - at < Duration::microseconds(1),
        "marker {got} for an erase at {at}"
    );
}

/// Erasure markers and the writes they guard: a turn, fragment or state derived from turns
/// recorded at or before its conversation's (or tenant's) marker is not written, however late
/// it arrives; `purge_erased` removes what a marker covers and nothing recorded after it.
async fn graph_erasure(g: Arc<dyn Graph>, residue: Residue) {
    // Markers are never removed: a fresh tenant per run keeps a long-lived server usable.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let t = TenantId(format!("tenant-erasure-{run}"));
    let other = TenantId(format!("tenant-erasure-other-{run}"));
    let convs = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(g.erasures(&t, &convs(&["e1"])).await.unwrap().is_empty());
    let at = Utc::now();
    let recorded = |mut tr: Turn, when: chrono::DateTime<Utc>| {
        tr.recorded_at = when;
        tr
    };
    let before: Vec<(Turn, Extraction)> = (0..5)
        .map(|i| {
            (
                recorded(
                    turn(&t, "e1", i, "before the erase"),
                    at - Duration::seconds(10),
                ),
                extraction(&["secret"], "Zoë", 2),
            )
        })
        .collect();
    g.write_turns(&before).await.unwrap();
    // Both listings, whole and paged, agree through every step of an erasure.
    let listed = || async {
        let all = g.conversations(&t).await.unwrap();
        assert_eq!(g.conversations_after(&t, None, 100).await.unwrap(), all);
        all
    };
    assert_eq!(listed().await, convs(&["e1"]));
    let frag = |id: &str, members: Vec<MemoryId>| Fragment {
        id: id.into(),
        tenant: t.clone(),
        conversation_id: "e1".into(),
        description: "secret".into(),
        members,
        keywords: vec!["secret".into()],
        created_at: Utc::now(),
    };
    let f = frag(
        "f-before",
        vec![before[0].0.memory_id, before[1].0.memory_id],
    );
    g.write_fragments(std::slice::from_ref(&f)).await.unwrap();
    let mut st = crate::graph::ConversationState::default();
    st.derived_from(before[0].0.recorded_at);
    st.next_position = 5;
    assert!(g.save_conversation_state(&t, "e1", &st).await.unwrap());

    // The marker; an older one never moves it back. Per tenant and per conversation. Each
    // says what it covered as it was recorded: the conversation and its five turns.
    assert_eq!(
        g.record_erasure(&t, Some("e1"), at).await.unwrap(),
        vec![("e1".to_string(), 5)]
    );
    g.record_erasure(&t, Some("e1"), at - Duration::hours(1))
        .await
        .unwrap();
    assert!(g
        .record_erasure(&t, Some("never-stored"), at)
        .await
        .unwrap()
        .is_empty());
    let e = g.erasures(&t, &convs(&["e1", "e2"])).await.unwrap();
    assert_marker(e.marker("e1"), at);
    assert_eq!((e.marker("e2"), e.tenant), (None, None));
    assert!(g
        .erasures(&other, &convs(&["e1"]))
        .await
        .unwrap()
        .is_empty());

    // Late writes of erased data are refused by the store itself.
    let late = (
        recorded(turn(&t, "e1", 7, "late turn"), at - Duration::seconds(1)),
        extraction(&["secret", "late"], "Zoë", 3),
    );
    g.write_turns(std::slice::from_ref(&late)).await.unwrap();
    assert!(g.turns(&t, &[late.0.memory_id]).await.unwrap().is_empty());
    assert!(!g.save_conversation_state(&t, "e1", &st).await.unwrap());
    // A state of unknown origin counts as erased data too.
    let legacy = crate::graph::ConversationState {
        next_position: 3,
        ..Default::default()
    };
    assert!(!g.save_conversation_state(&t, "e1", &legacy).await.unwrap());
    // Saved together, each conversation is judged on its own: the erased one is refused, the
    // others are saved, whichever tenant they are in, and a saved state is read back.
    let mut fresh = crate::graph::ConversationState::default();
    fresh.derived_from(Utc::now());
    fresh.next_position = 2;
    assert_eq!(
        g.save_conversation_states(vec![
            (t.clone(), "e2".into(), fresh.clone()),
            (t.clone(), "e1".into(), st.clone()),
            (other.clone(), "e1".into(), fresh.clone()),
        ])
        .await
        .unwrap(),
        vec![true, false, true]
    );
    assert_eq!(
        g.conversation_state(&t, "e2").await.unwrap().next_position,
        2
    );
    assert_eq!(
        g.conversation_state(&other, "e1")
            .await
            .unwrap()
            .next_position,
        2
    );
    assert!(g
        .save_conversation_states(Vec::new())
        .await
        .unwrap()
        .is_empty());
    let f2 = frag("f-late", vec![before[2].0.memory_id]);
    g.write_fragments(std::slice::from_ref(&f2)).await.unwrap();
    assert!(g
        .fragments(&t, std::slice::from_ref(&f2.id))
        .await
        .unwrap()
        .is_empty());

    // Purge: everything the marker covers goes; the fragment made before the erase with it.
    assert!(residue(t.clone(), "e1".into()).await > 0);
    assert_eq!(g.purge_erased(&t, "e1").await.unwrap(), 5);
    assert_eq!(
        residue(t.clone(), "e1".into()).await,
        0,
        "purge leaves nothing"
    );
    assert!(
        listed().await.is_empty(),
        "a conversation without turns is not listed"
    );
    assert!(g
        .fragments(&t, std::slice::from_ref(&f.id))
        .await
        .unwrap()
        .is_empty());
    g.write_fragments(std::slice::from_ref(&f)).await.unwrap();
    assert!(
        g.fragments(&t, std::slice::from_ref(&f.id))
            .await
            .unwrap()
            .is_empty(),
        "a fragment of erased turns is not written back"
    );

    // Recorded after the erase: kept, with its state and fragment, and purge leaves it alone.
    let after = (
        recorded(
            turn(&t, "e1", 0, "after the erase"),
            at + Duration::seconds(1),
        ),
        extraction(&["fresh"], "Zoë", 4),
    );
    g.write_turns(std::slice::from_ref(&after)).await.unwrap();
    assert_eq!(g.turns(&t, &[after.0.memory_id]).await.unwrap().len(), 1);
    assert_eq!(
        listed().await,
        convs(&["e1"]),
        "listed again once it has turns"
    );
    let mut st2 = crate::graph::ConversationState::default();
    st2.derived_from(after.0.recorded_at);
    st2.next_position = 1;
    assert!(g.save_conversation_state(&t, "e1", &st2).await.unwrap());
    let f3 = frag("f-after", vec![after.0.memory_id]);
    g.write_fragments(std::slice::from_ref(&f3)).await.unwrap();
    assert_eq!(
        g.fragments(&t, std::slice::from_ref(&f3.id)).await.unwrap(),
        vec![f3]
    );
    assert_eq!(g.purge_erased(&t, "e1").await.unwrap(), 0);
    assert_eq!(
        g.conversation_turns(&t, "e1", 0, u64::MAX)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(g.conversation_state(&t, "e1").await.unwrap(), st2);

    // A tenant-wide marker covers every conversation of the tenant, ones never stored too.
    g.write_turns(&[(
        recorded(
            turn(&t, "e3", 0, "other conversation"),
            at + Duration::seconds(1),
        ),
        extraction(&["other"], "Zoë", 5),
    )])
    .await
    .unwrap();
    assert_eq!(listed().await, convs(&["e1", "e3"]));
    let tat = at + Duration::seconds(2);
    assert_eq!(
        g.record_erasure(&t, None, tat).await.unwrap(),
        vec![("e1".to_string(), 1), ("e3".to_string(), 1)],
        "a tenant's marker counts each of its conversations"
    );
    let e = g.erasures(&t, &convs(&["e1", "e3"])).await.unwrap();
    assert_marker(e.tenant, tat);
    assert_marker(e.marker("e1"), tat);
    assert_marker(e.marker("e3"), tat);
    g.write_turns(&[(
        recorded(turn(&t, "e4", 0, "in flight"), at + Duration::seconds(1)),
        extraction(&["other"], "Zoë", 5),
    )])
    .await
    .unwrap();
    assert!(!g
        .conversations(&t)
        .await
        .unwrap()
        .contains(&"e4".to_string()));
    assert_eq!(g.purge_erased(&t, "e1").await.unwrap(), 1);
    assert_eq!(g.purge_erased(&t, "e3").await.unwrap(), 1);
    for c in ["e1", "e3", "e4"] {
        assert_eq!(residue(t.clone(), c.into()).await, 0, "{c}");
    }
    assert!(listed().await.is_empty());
    // Another tenant's turns of the same time are untouched.
    let kept = (
        recorded(turn(&other, "e1", 0, "other tenant"), at),
        extraction(&["secret"], "Zoë", 2),
    );
    g.write_turns(std::slice::from_ref(&kept)).await.unwrap();
    assert_eq!(g.purge_erased(&other, "e1").await.unwrap(), 0);
    assert_eq!(g.turns(&other, &[kept.0.memory_id]).await.unwrap().len(), 1);
    assert_eq!(g.conversations(&other).await.unwrap(), convs(&["e1"]));
    assert_eq!(g.delete_conversation(&other, "e1").await.unwrap(), 1);
    assert!(g.conversations(&other).await.unwrap().is_empty());
    // A conversation deleted whole is listed again once a turn of it is written.
    g.write_turns(std::slice::from_ref(&kept)).await.unwrap();
    assert_eq!(g.conversations(&other).await.unwrap(), convs(&["e1"]));
    assert_eq!(g.delete_conversation(&other, "e1").await.unwrap(), 1);
}

/// Every text field (tenant, conversation, turn id, texts, speakers, keywords, entities,
/// locations, references, fragment ids, state) with unicode, quotes and backslashes.
async fn graph_unicode(g: Arc<dyn Graph>, residue: Residue) {
    let t = TenantId("tënant \"q\" 'x' \\ ∑".into());
    let conv = "conv \"ü\" 'x' \\ 会話";
    let odd = "Zoë \"Z\" O'Neil \\ 🐕";
    let mut tr = turn(&t, conv, 0, odd);
    tr.turn_id = format!("turn {odd}");
    tr.memory_id = MemoryId::derive(&t, conv, &tr.turn_id);
    tr.assistant = format!("assistant {odd}");
    tr.metadata.insert("note".into(), serde_json::json!(odd));
    let mut x = extraction(&[odd, "plain"], odd, 5);
    x.locations = vec![odd.to_string()];
    x.references = vec![recollect_model::Reference {
        mention: odd.into(),
        kind: "entity".into(),
        resolved: odd.into(),
        field: recollect_model::Field::User,
    }];
    g.write_turns(&[(tr.clone(), x.clone())]).await.unwrap();
    g.write_turns(&[(tr.clone(), x.clone())]).await.unwrap();
    let got = g.turns(&t, &[tr.memory_id]).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].turn, tr, "every turn field survives");
    assert_eq!(got[0].extraction, x, "every extraction field survives");
    assert_eq!(g.conversations(&t).await.unwrap(), vec![conv.to_string()]);
    for kind in NodeKind::ALL {
        let names = kind.names(&x);
        let vocab = g.vocabulary(&t, &Scope::of(&[conv]), kind).await.unwrap();
        assert_eq!(vocab, names, "{kind:?} names survive");
        let linked = g
            .linked_turns(&t, &Scope::of(&[conv]), kind, &names, None, None)
            .await
            .unwrap();
        assert_eq!(linked.len(), names.len(), "{kind:?} links");
        assert!(linked.iter().all(|l| l.memory_id == tr.memory_id
            && l.conversation_id == conv
            && names.contains(&l.name)));
    }
    let f = Fragment {
        id: format!("fragment {odd}"),
        tenant: t.clone(),
        conversation_id: conv.into(),
        description: odd.into(),
        members: vec![tr.memory_id],
        keywords: vec![odd.into()],
        created_at: Utc::now(),
    };
    g.write_fragments(std::slice::from_ref(&f)).await.unwrap();
    assert_eq!(
        g.fragments(&t, std::slice::from_ref(&f.id)).await.unwrap(),
        vec![f.clone()]
    );
    assert_eq!(
        g.turns(&t, &[tr.memory_id]).await.unwrap()[0].fragments,
        vec![f.id.clone()]
    );
    let mut st = crate::graph::ConversationState::default();
    st.reference.entities.push(odd.into());
    st.reference_position = Some(0);
    g.save_conversation_state(&t, conv, &st).await.unwrap();
    assert_eq!(g.conversation_state(&t, conv).await.unwrap(), st);
    assert_eq!(g.delete_conversation(&t, conv).await.unwrap(), 1);
    assert_eq!(
        residue(t.clone(), conv.to_string()).await,
        0,
        "erasure leaves nothing"
    );
}

/// One write of 1, 10, 1,000 and 10,000 turns: each turn stored once, each link counted once.
async fn graph_batch_sizes(g: Arc<dyn Graph>, residue: Residue) {
    let t = TenantId("tenant-batch".into());
    for size in [1u64, 10, 1000, 10_000] {
        let conv = format!("size-{size}");
        let batch: Vec<(Turn, Extraction)> = (0..size)
            .map(|i| {
                (
                    turn(&t, &conv, i, &format!("batch turn {i}")),
                    extraction(
                        if i % 2 == 0 {
                            &["even", "all"]
                        } else {
                            &["all"]
                        },
                        "Zoë",
                        1 + (i % 28) as u32,
                    ),
                )
            })
            .collect();
        g.write_turns(&batch).await.unwrap();
        let stored = g.conversation_turns(&t, &conv, 0, u64::MAX).await.unwrap();
        assert_eq!(stored.len() as u64, size);
        assert!(stored
            .iter()
            .enumerate()
            .all(|(i, r)| r.turn.position == i as u64));
        let (n, df) = g
            .document_frequencies(
                &t,
                &Scope::of(&[&conv]),
                NodeKind::Keyword,
                &["all".into(), "even".into()],
            )
            .await
            .unwrap();
        assert_eq!((n, df), (size, vec![size, size.div_ceil(2)]));
        assert_eq!(g.delete_conversation(&t, &conv).await.unwrap(), size);
        assert_eq!(
            residue(t.clone(), conv.clone()).await,
            0,
            "erasure of {size} turns"
        );
    }
}

async fn graph_semantics(g: Arc<dyn Graph>, residue: Residue) {
    let a = TenantId("tenant-a".into());
    let b = TenantId("tenant-b".into());
    let turns: Vec<(Turn, Extraction)> = (0..50)
        .map(|i| {
            (
                turn(
                    &a,
                    "c1",
                    i,
                    &format!("turn {i} über “quotes” 'and' \\ backslashes"),
                ),
                extraction(
                    if i % 2 == 0 {
                        &["dog", "park"]
                    } else {
                        &["cat"]
                    },
                    "Zoë",
                    1 + (i % 28) as u32,
                ),
            )
        })
        .collect();
    // Write twice: one result.
    g.write_turns(&turns).await.unwrap();
    g.write_turns(&turns).await.unwrap();
    let got = g.conversation_turns(&a, "c1", 0, u64::MAX).await.unwrap();
    assert_eq!(got.len(), 50);
    assert!(got
        .windows(2)
        .all(|w| w[0].turn.position < w[1].turn.position));
    assert_eq!(
        got[3].turn.user, turns[3].0.user,
        "unicode and quotes survive"
    );
    let (n, df) = g
        .document_frequencies(
            &a,
            &Scope::all(),
            NodeKind::Keyword,
            &["dog".into(), "cat".into()],
        )
        .await
        .unwrap();
    assert_eq!((n, df), (50, vec![25, 25]));

    // Another tenant with the same conversation id sees nothing of tenant A's.
    g.write_turns(&[(
        turn(&b, "c1", 0, "b's turn"),
        extraction(&["dog"], "Other", 2),
    )])
    .await
    .unwrap();
    let linked = g
        .linked_turns(
            &b,
            &Scope::all(),
            NodeKind::Keyword,
            &["dog".into()],
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(linked.len(), 1);
    assert!(g
        .turns(&b, &[turns[0].0.memory_id])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(g.conversations(&b).await.unwrap(), vec!["c1".to_string()]);

    // Scope filters.
    g.write_turns(&[(
        turn(&a, "c2", 0, "other conv"),
        extraction(&["dog"], "Zoë", 3),
    )])
    .await
    .unwrap();
    // A scope's conversations checked without listing the tenant's: once each, as asked.
    let known = |t: &TenantId, asked: &[&str]| {
        let (g, t) = (g.clone(), t.clone());
        let asked: Vec<String> = asked.iter().map(|c| c.to_string()).collect();
        async move { g.known_conversations(&t, &asked).await.unwrap() }
    };
    assert_eq!(known(&a, &["c2", "nope", "c1", "c2"]).await, ["c2", "c1"]);
    assert_eq!(known(&b, &["c2", "c1"]).await, ["c1"]);
    assert!(known(&a, &[]).await.is_empty());
    let dogs = |scope: Scope| {
        let g = g.clone();
        let a = a.clone();
        async move {
            g.linked_turns(&a, &scope, NodeKind::Keyword, &["dog".into()], None, None)
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(dogs(Scope::all()).await, 26);
    // A name asked twice links its turns once.
    let twice = g
        .linked_turns(
            &a,
            &Scope::all(),
            NodeKind::Keyword,
            &["dog".into(), "dog".into()],
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(twice.len(), 26);
    assert_eq!(dogs(Scope::of(&["c2"])).await, 1);
    assert_eq!(dogs(Scope::of(&["c1", "c2"])).await, 26);
    let ents = g
        .vocabulary(&a, &Scope::of(&["c1"]), NodeKind::Entity)
        .await
        .unwrap();
    assert_eq!(ents, vec!["zoë".to_string()]);
    let locs = g
        .vocabulary(&a, &Scope::of(&["c1"]), NodeKind::Location)
        .await
        .unwrap();
    assert_eq!(locs, vec!["café \"zürich\"".to_string()]);

    // Bi-temporal as-of: nothing was recorded before the writes; event time filters by validity.
    let before = Utc::now() - Duration::days(1);
    assert!(g
        .linked_turns(
            &a,
            &Scope::of(&["c1"]),
            NodeKind::Keyword,
            &["dog".into()],
            Some(before),
            None
        )
        .await
        .unwrap()
        .is_empty());
    let may10 = Utc.with_ymd_and_hms(2023, 5, 10, 12, 0, 0).unwrap();
    let held = g
        .linked_turns(
            &a,
            &Scope::of(&["c1"]),
            NodeKind::Keyword,
            &["dog".into(), "cat".into()],
            None,
            Some(may10),
        )
        .await
        .unwrap();
    assert_eq!(
        held.len(),
        20,
        "turns whose event time is on or before 10 May"
    );

    // Fragments and conversation state.
    let f = Fragment {
        id: "frag-1".into(),
        tenant: a.clone(),
        conversation_id: "c1".into(),
        description: "dogs".into(),
        members: vec![turns[0].0.memory_id, turns[2].0.memory_id],
        keywords: vec!["dog".into(), "park".into()],
        created_at: Utc::now(),
    };
    g.write_fragments(std::slice::from_ref(&f)).await.unwrap();
    g.write_fragments(std::slice::from_ref(&f)).await.unwrap();
    let recs = g.turns(&a, &[turns[0].0.memory_id]).await.unwrap();
    assert_eq!(recs[0].fragments, vec!["frag-1".to_string()]);
    assert_eq!(g.fragments(&a, &["frag-1".into()]).await.unwrap(), vec![f]);
    assert!(g
        .fragments(&b, &["frag-1".into()])
        .await
        .unwrap()
        .is_empty());
    let mut st = g.conversation_state(&a, "c1").await.unwrap();
    st.consolidated_until = 10;
    st.reference.entities.push("Zoë".into());
    g.save_conversation_state(&a, "c1", &st).await.unwrap();
    assert_eq!(g.conversation_state(&a, "c1").await.unwrap(), st);
    // The consolidator advances its progress while the extractor saves a copy it loaded
    // earlier: neither undoes the other, and progress never moves back.
    let mut stale = g.conversation_state(&a, "c1").await.unwrap();
    g.advance_consolidated_until(&a, "c1", 20).await.unwrap();
    stale.next_position = 7;
    g.save_conversation_state(&a, "c1", &stale).await.unwrap();
    let st = g.conversation_state(&a, "c1").await.unwrap();
    assert_eq!((st.next_position, st.consolidated_until), (7, 20));
    g.advance_consolidated_until(&a, "c1", 10).await.unwrap();
    assert_eq!(
        g.conversation_state(&a, "c1")
            .await
            .unwrap()
            .consolidated_until,
        20
    );

    // Concurrent writers on one conversation: every turn exactly once.
    let mut handles = Vec::new();
    for w in 0..4u64 {
        let g = g.clone();
        let a = a.clone();
        handles.push(tokio::spawn(async move {
            let batch: Vec<(Turn, Extraction)> = (0..25)
                .map(|i| {
                    (
                        turn(&a, "c3", w * 25 + i, "concurrent"),
                        extraction(&["bird"], "Zoë", 4),
                    )
                })
                .collect();
            g.write_turns(&batch).await.unwrap();
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(
        g.conversation_turns(&a, "c3", 0, u64::MAX)
            .await
            .unwrap()
            .len(),
        100
    );
    let (_, df) = g
        .document_frequencies(&a, &Scope::of(&["c3"]), NodeKind::Keyword, &["bird".into()])
        .await
        .unwrap();
    assert_eq!(df, vec![100]);

    // Erasure leaves nothing of the conversation and touches nothing else.
    assert!(
        residue(a.clone(), "c1".into()).await > 0,
        "the residue check sees data"
    );
    assert_eq!(g.delete_conversation(&a, "c1").await.unwrap(), 50);
    assert_eq!(
        residue(a.clone(), "c1".into()).await,
        0,
        "nothing left in the backend"
    );
    assert!(g
        .conversation_turns(&a, "c1", 0, u64::MAX)
        .await
        .unwrap()
        .is_empty());
    assert!(g
        .turns(&a, &[turns[0].0.memory_id])
        .await
        .unwrap()
        .is_empty());
    assert!(g
        .vocabulary(&a, &Scope::of(&["c1"]), NodeKind::Keyword)
        .await
        .unwrap()
        .is_empty());
    assert!(g
        .fragments(&a, &["frag-1".into()])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        g.conversation_state(&a, "c1").await.unwrap(),
        Default::default()
    );
    assert!(!g
        .conversations(&a)
        .await
        .unwrap()
        .contains(&"c1".to_string()));
    assert_eq!(known(&a, &["c1", "c2"]).await, ["c2"]);
    assert_eq!(dogs(Scope::all()).await, 1);
    assert_eq!(
        g.linked_turns(
            &b,
            &Scope::all(),
            NodeKind::Keyword,
            &["dog".into()],
            None,
            None
        )
        .await
        .unwrap()
        .len(),
        1
    );
}

/// Kept versions: an edit's replaced point is kept (once, however often the edit is
/// redelivered), invisible to searches of the present and counts, found as of a time when it
/// was current (mapped to its memory), its vectors readable by version; erasure of the turn or
/// the conversation takes every kept version.
async fn vector_versions(v: Arc<dyn VectorIndex>, dim: usize) {
    let t = TenantId("tenant-versions".into());
    let base = Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap();
    let point = |i: usize, seed: usize, recorded_at: chrono::DateTime<Utc>| TurnPoint {
        memory_id: MemoryId::derive(&t, "v", &i.to_string()),
        tenant: t.clone(),
        conversation_id: "v".into(),
        turn_id: i.to_string(),
        position: i as u64,
        timestamp: base,
        recorded_at,
        user_speaker: None,
        assistant_speaker: None,
        user_id: None,
        agent_id: None,
        metadata: Default::default(),
        user: vector(dim, seed),
        assistant: None,
        lexical: SparseVector {
            indices: vec![seed as u32],
            values: vec![1.0],
        },
        late: None,
    };
    let (t1, t2) = (base + Duration::hours(1), base + Duration::hours(2));
    let id = MemoryId::derive(&t, "v", "0");
    v.upsert_turns(vec![point(0, 501, t1), point(1, 502, t1)])
        .await
        .unwrap();
    let replaced = crate::vector::ReplacedVersion {
        memory_id: id,
        recorded_at: t1,
        expired_at: t2,
    };
    v.keep_versions(&t, &[replaced]).await.unwrap();
    v.upsert_turns(vec![point(0, 503, t2)]).await.unwrap();
    // Redelivered: the point is the edit's now, nothing more is kept.
    v.keep_versions(&t, &[replaced]).await.unwrap();
    let scope = Scope::of(&["v"]);
    assert_eq!(
        v.count(&t, &scope).await.unwrap(),
        2,
        "kept versions are not counted"
    );
    let dense = |seed: usize| VectorQuery::Dense {
        field: VectorField::User,
        vector: vector(dim, seed),
    };
    let now = v.search(&t, &scope, &dense(501), 10).await.unwrap();
    assert_eq!(now.len(), 2, "{now:?}");
    let back_then = Scope {
        as_of: Some(t1 + Duration::minutes(30)),
        ..scope.clone()
    };
    let old = v.search(&t, &back_then, &dense(501), 10).await.unwrap();
    assert_eq!(old.len(), 2, "each memory once: {old:?}");
    assert_eq!(old[0].0, id, "the kept version, under its memory: {old:?}");
    assert!(old[0].1 > 0.99, "{old:?}");
    let lexical = v
        .search(
            &t,
            &back_then,
            &VectorQuery::Lexical(SparseVector {
                indices: vec![501],
                values: vec![1.0],
            }),
            10,
        )
        .await
        .unwrap();
    assert_eq!(lexical.first().map(|h| h.0), Some(id), "{lexical:?}");
    let before_all = Scope {
        as_of: Some(base),
        ..scope.clone()
    };
    assert!(v
        .search(&t, &before_all, &dense(501), 10)
        .await
        .unwrap()
        .is_empty());
    let kept = v.version_vectors(&t, &[(id, t1)]).await.unwrap();
    assert_eq!(kept[&id].user, vector(dim, 501));
    assert!(v
        .version_vectors(&TenantId("tenant-other".into()), &[(id, t1)])
        .await
        .unwrap()
        .is_empty());
    // Erasure of the turn takes its kept versions; of the conversation, everything.
    v.delete_turns(&t, "v", &[id], &[]).await.unwrap();
    assert!(v.version_vectors(&t, &[(id, t1)]).await.unwrap().is_empty());
    v.upsert_turns(vec![point(0, 501, t1)]).await.unwrap();
    v.keep_versions(&t, &[replaced]).await.unwrap();
    assert_eq!(v.version_vectors(&t, &[(id, t1)]).await.unwrap().len(), 1);
    v.delete_conversation(&t, "v").await.unwrap();
    assert!(v.version_vectors(&t, &[(id, t1)]).await.unwrap().is_empty());
}

/// A turn point of `conversation` with a user field, a lexical vector and nothing else.
pub(crate) fn bare_point(
    t: &TenantId,
    conversation: &str,
    i: usize,
    user: Vec<f32>,
    lexical: SparseVector,
) -> TurnPoint {
    let at = Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap();
    TurnPoint {
        memory_id: MemoryId::derive(t, conversation, &i.to_string()),
        tenant: t.clone(),
        conversation_id: conversation.into(),
        turn_id: i.to_string(),
        position: i as u64,
        timestamp: at,
        recorded_at: at,
        user_speaker: None,
        assistant_speaker: None,
        user,
        assistant: None,
        lexical,
        user_id: None,
        agent_id: None,
        metadata: Default::default(),
        late: None,
    }
}

/// Lexical search where the engine prunes: a scope past its sparse full-scan threshold (5,000
/// points) and a query of two terms, past the engine's first batch of 10,000 ids. The engine
/// skips the rest of the longer posting list when the bound on its weights (kept per element,
/// as the maximum weight after it) says nothing there can beat the top so far; so a heavy weight
/// appended late, and a term an update adds to a point in the middle of a list, must raise the
/// bounds before them, or the best turn is skipped. The embedded engine is built with a patch to
/// exactly that bookkeeping (scripts/qdrant-edge/sparse-append.patch); this checks it, and the
/// same answers from the servers.
async fn vector_lexical_pruning(v: Arc<dyn VectorIndex>, dim: usize) {
    let t = TenantId("tenant-pruning".into());
    // Terms no other case uses; COMMON in every even turn, RARE in a few, FILLER in every odd
    // one (BM25's IDF counts the points that have a lexical vector at all).
    const COMMON: u32 = 700_001;
    const RARE: u32 = 700_002;
    const FILLER: u32 = 700_003;
    const N: usize = 12_001;
    const HEAVY: usize = 11_000;
    let id = |i: usize| MemoryId::derive(&t, "p", &i.to_string());
    let point = |i: usize, terms: Vec<(u32, f32)>| {
        let lexical = SparseVector {
            indices: terms.iter().map(|(d, _)| *d).collect(),
            values: terms.iter().map(|(_, w)| *w).collect(),
        };
        bare_point(&t, "p", i, vector(dim, i), lexical)
    };
    // Turns written one at a time with FILLER alone, between the first 10,000 and the rest: the
    // engine numbers a batch's points in hash order, single ones in order, so the last of them
    // is the first element after the engine's first batch once an update gives it COMMON.
    let gap = 10_000..10_020;
    let terms = |i: usize| {
        let mut out = vec![if i.is_multiple_of(2) && !gap.contains(&i) {
            (COMMON, if i == HEAVY { 20.0 } else { 1.0 })
        } else {
            (FILLER, 1.0)
        }];
        if i < 5 || i == N - 1 {
            out.push((RARE, 1.0));
        }
        out
    };
    let pts: Vec<TurnPoint> = (0..N).map(|i| point(i, terms(i))).collect();
    for chunk in pts[..gap.start].chunks(2_000) {
        v.upsert_turns(chunk.to_vec()).await.unwrap();
    }
    for p in &pts[gap.clone()] {
        v.upsert_turns(vec![p.clone()]).await.unwrap();
    }
    for chunk in pts[gap.end..N - 1].chunks(2_000) {
        v.upsert_turns(chunk.to_vec()).await.unwrap();
    }
    // Alone and last, so RARE's last element comes after the heavy turn: skipping to it (what a
    // wrong bound lets the engine do) would pass the heavy turn by.
    v.upsert_turns(vec![pts[N - 1].clone()]).await.unwrap();
    let query = VectorQuery::Lexical(SparseVector {
        indices: vec![COMMON, RARE],
        values: vec![1.0, 1.0],
    });
    // With BM25's IDF, COMMON weighs ~0.7 and RARE ~7.5: the heavy turn (20 × 0.7) beats the
    // turns with both terms (~8.2), which fill the top first.
    let best = |hits: &[(MemoryId, f32)]| hits.first().map(|h| h.0);
    let hits = v.search(&t, &Scope::all(), &query, 3).await.unwrap();
    assert_eq!(best(&hits), Some(id(HEAVY)), "appended last: {hits:?}");
    // An update that adds COMMON to the gap's last turn: the element lands in the middle of the
    // list, first in line when the engine decides whether to skip the rest.
    v.upsert_turns(vec![point(gap.end - 1, vec![(COMMON, 1.0), (FILLER, 1.0)])])
        .await
        .unwrap();
    let hits = v.search(&t, &Scope::all(), &query, 3).await.unwrap();
    assert_eq!(best(&hits), Some(id(HEAVY)), "inserted mid-list: {hits:?}");
    // A heavier turn appended after the insert raises the inserted element's bound as well.
    v.upsert_turns(vec![point(N, vec![(COMMON, 30.0)])])
        .await
        .unwrap();
    let hits = v.search(&t, &Scope::all(), &query, 3).await.unwrap();
    assert_eq!(
        best(&hits),
        Some(id(N)),
        "appended after the insert: {hits:?}"
    );
    assert_eq!(hits.get(1).map(|h| h.0), Some(id(HEAVY)), "{hits:?}");
    v.delete_conversation(&t, "p").await.unwrap();
}

/// Ties are settled by memory id, smaller first, at the limit too, whatever order the engine
/// meets the tied points in (it follows how they were written and merged, so an ingest's
/// timing): the same turns give the same answer.
async fn vector_ties(v: Arc<dyn VectorIndex>, dim: usize) {
    let t = TenantId("tenant-ties".into());
    const TERM: u32 = 700_101;
    let point = |i: usize, weight: f32, seed: usize| {
        let lexical = SparseVector {
            indices: vec![TERM],
            values: vec![weight],
        };
        bare_point(&t, "ties", i, vector(dim, seed), lexical)
    };
    // Eight tied turns and one above them on BM25 (below them on the dense vector).
    let mut tied: Vec<TurnPoint> = (0..8).map(|i| point(i, 1.0, 1)).collect();
    let best = point(8, 3.0, 5);
    // Written one at a time, the largest id first: the order the engine meets them in.
    tied.sort_by_key(|p| std::cmp::Reverse(p.memory_id));
    v.upsert_turns(vec![best.clone()]).await.unwrap();
    for p in &tied {
        v.upsert_turns(vec![p.clone()]).await.unwrap();
    }
    let mut by_id: Vec<MemoryId> = tied.iter().map(|p| p.memory_id).collect();
    by_id.sort();
    let scope = Scope::of(&["ties"]);
    let ids = |hits: Vec<(MemoryId, f32)>| hits.into_iter().map(|h| h.0).collect::<Vec<_>>();
    let lexical = VectorQuery::Lexical(SparseVector {
        indices: vec![TERM],
        values: vec![1.0],
    });
    let dense = VectorQuery::Dense {
        field: VectorField::User,
        vector: vector(dim, 1),
    };
    for limit in [1, 3, 7, 8, 20] {
        let hits = ids(v.search(&t, &scope, &lexical, limit).await.unwrap());
        let want: Vec<MemoryId> = std::iter::once(best.memory_id)
            .chain(by_id.iter().copied())
            .take(limit)
            .collect();
        assert_eq!(hits, want, "lexical, limit {limit}");
        let hits = ids(v.search(&t, &scope, &dense, limit).await.unwrap());
        let want: Vec<MemoryId> = by_id
            .iter()
            .copied()
            .chain(std::iter::once(best.memory_id))
            .take(limit)
            .collect();
        assert_eq!(hits, want, "dense, limit {limit}");
    }
    v.delete_conversation(&t, "ties").await.unwrap();
}

/// Every form of a keyword a conversation said is kept, whichever came first and however the
/// writer batched them: a question's "games" meets the turn's "games" at cosine 1, not only a
/// "game" written earlier. An erasure of the keyword takes every form.
async fn vector_keyword_forms(v: Arc<dyn VectorIndex>, dim: usize) {
    let t = TenantId("tenant-forms".into());
    let form = |seed: usize| KeywordVector {
        keyword: "game".into(),
        vector: vector(dim, seed).into(),
    };
    let set = |keywords: Vec<KeywordVector>| KeywordSet {
        tenant: t.clone(),
        conversation: "forms".into(),
        keywords,
    };
    // One batch says two forms (one of them twice), a later batch a third.
    v.upsert_keyword_sets(vec![set(vec![form(31), form(32), form(31)])])
        .await
        .unwrap();
    v.upsert_keyword_sets(vec![set(vec![form(33)])])
        .await
        .unwrap();
    let scope = Scope::of(&["forms"]);
    for seed in [31, 32, 33] {
        let near = v
            .search_keywords(&t, &scope, &vector(dim, seed), 30, -1.0)
            .await
            .unwrap();
        assert_eq!(near.len(), 1, "the keyword is named once: {near:?}");
        assert_eq!(near[0].0, "game");
        assert!(near[0].1 > 0.999, "form {seed} is kept: {near:?}");
    }
    // A tenant-wide search names `limit` keywords however many conversations share the best.
    let shared = |c: usize| KeywordSet {
        tenant: t.clone(),
        conversation: format!("shared-{c}"),
        keywords: vec![
            form(31),
            KeywordVector {
                keyword: format!("own-{c}"),
                // Never the game form's vector (the pattern repeats every 23 seeds).
                vector: vector(dim, 32 + c % 20).into(),
            },
        ],
    };
    v.upsert_keyword_sets((0..40).map(shared).collect())
        .await
        .unwrap();
    let near = v
        .search_keywords(&t, &Scope::all(), &vector(dim, 31), 5, -1.0)
        .await
        .unwrap();
    let names: std::collections::HashSet<&str> = near.iter().map(|h| h.0.as_str()).collect();
    assert_eq!(names.len(), 5, "five distinct names: {near:?}");
    assert_eq!(near[0].0, "game");
    for c in 0..40 {
        v.delete_conversation(&t, &format!("shared-{c}"))
            .await
            .unwrap();
    }
    v.delete_turns(&t, "forms", &[], &["game".into()])
        .await
        .unwrap();
    assert!(v
        .search_keywords(&t, &scope, &vector(dim, 32), 30, -1.0)
        .await
        .unwrap()
        .is_empty());
    v.delete_conversation(&t, "forms").await.unwrap();
}

/// VectorIndex contract: a keyword whose many forms are all nearer the query than any other
/// keyword still leaves room for `limit` names, in a conversation and across the tenant.
async fn vector_keyword_many_forms(v: Arc<dyn VectorIndex>, dim: usize) {
    assert!(dim >= 16, "the forms take 16 axes");
    let t = TenantId("tenant-many-forms".into());
    // The first axis, leaning `lean` towards another.
    let near = |axis: usize, lean: f32| {
        let mut x = vec![0.0; dim];
        x[0] = 1.0;
        x[axis] = lean;
        unit(&mut x);
        x
    };
    let kw = |keyword: &str, vector: Vec<f32>| KeywordVector {
        keyword: keyword.into(),
        vector: vector.into(),
    };
    // Twelve forms of `play` at cosine 0.995, then `ball` at 0.894 and `rest` at 0.857.
    let mut keywords: Vec<KeywordVector> = (1..=12).map(|a| kw("play", near(a, 0.1))).collect();
    keywords.push(kw("ball", near(13, 0.5)));
    keywords.push(kw("rest", near(14, 0.6)));
    v.upsert_keyword_sets(vec![KeywordSet {
        tenant: t.clone(),
        conversation: "many-forms".into(),
        keywords,
    }])
    .await
    .unwrap();
    let query = near(15, 0.0);
    for scope in [Scope::of(&["many-forms"]), Scope::all()] {
        let found = v
            .search_keywords(&t, &scope, &query, 2, -1.0)
            .await
            .unwrap();
        let names: Vec<&str> = found.iter().map(|h| h.0.as_str()).collect();
        assert_eq!(names, ["play", "ball"], "{scope:?}: {found:?}");
        assert!((found[0].1 - 0.995).abs() < 1e-3, "{found:?}");
    }
    v.delete_conversation(&t, "many-forms").await.unwrap();
}

/// VectorIndex contract: idempotent upserts, field search, lexical search, tenant isolation,
/// keyword neighbours, erasure, batch sizes.
/// Turn filters inside the search: every condition, and `limit` matching turns whenever that
/// many exist, however many better-scoring turns fail the filter.
async fn vector_filters(v: Arc<dyn VectorIndex>, dim: usize) {
    let t = TenantId("tenant-filters".into());
    let base = Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap();
    let pts: Vec<TurnPoint> = (0..60)
        .map(|i| TurnPoint {
            memory_id: MemoryId::derive(&t, "f", &i.to_string()),
            tenant: t.clone(),
            conversation_id: "f".into(),
            turn_id: i.to_string(),
            position: i as u64,
            timestamp: base + Duration::days(i as i64),
            recorded_at: base,
            user_speaker: Some(if i % 2 == 0 { "Maya" } else { "Leo" }.into()),
            assistant_speaker: Some("Bot".into()),
            // Nearly the same vector everywhere: the filter, not the score, decides.
            user: vector(dim, 7 + (i % 2)),
            assistant: (i % 5 == 0).then(|| vector(dim, 7)),
            lexical: SparseVector {
                indices: vec![42],
                values: vec![1.0 + i as f32 / 100.0],
            },
            user_id: Some(format!("u-{}", i % 3)),
            agent_id: (i % 4 == 0).then(|| "agent-x".to_string()),
            metadata: serde_json::json!({"tier": if i < 10 { "gold" } else { "free" },
                                         "n": i % 6, "paid": i % 2 == 1, "score": 0.5})
            .as_object()
            .unwrap()
            .clone(),
            late: None,
        })
        .collect();
    v.upsert_turns(pts.clone()).await.unwrap();
    let q = VectorQuery::Dense {
        field: VectorField::User,
        vector: vector(dim, 7),
    };
    let lex = VectorQuery::Lexical(SparseVector {
        indices: vec![42],
        values: vec![1.0],
    });
    let by_id: std::collections::HashMap<MemoryId, &TurnPoint> =
        pts.iter().map(|p| (p.memory_id, p)).collect();
    let scope = |f: serde_json::Value| Scope {
        conversations: Some(vec!["f".into()]),
        filter: serde_json::from_value(f).unwrap(),
        as_of: None,
    };
    type Want = Box<dyn Fn(&TurnPoint) -> bool>;
    let cases: Vec<(serde_json::Value, Want)> = vec![
        (
            serde_json::json!({"user_ids": ["u-1"]}),
            Box::new(|p| p.user_id.as_deref() == Some("u-1")),
        ),
        (
            serde_json::json!({"user_ids": ["u-1", "u-2"], "agent_ids": ["agent-x"]}),
            Box::new(|p| p.user_id.as_deref() != Some("u-0") && p.agent_id.is_some()),
        ),
        (
            serde_json::json!({"speakers": ["Leo"]}),
            Box::new(|p| p.user_speaker.as_deref() == Some("Leo")),
        ),
        (
            serde_json::json!({"speakers": ["Bot"]}),
            Box::new(|p| p.assistant.is_some()),
        ),
        (
            serde_json::json!({"from": "2024-01-11T00:00:00Z", "to": "2024-01-21T00:00:00Z"}),
            Box::new(|p| (10..20).contains(&p.position)),
        ),
        (
            serde_json::json!({"metadata": {"tier": "gold"}}),
            Box::new(|p| p.position < 10),
        ),
        (
            serde_json::json!({"metadata": {"n": 4, "paid": false, "score": 0.5}}),
            Box::new(|p| p.position % 6 == 4),
        ),
        (
            serde_json::json!({"metadata": {"n": 4.0}}),
            Box::new(|p| p.position % 6 == 4),
        ),
    ];
    for (f, want) in &cases {
        let expected = pts.iter().filter(|p| want(p)).count();
        assert!(expected > 0, "{f}");
        for query in [&q, &lex] {
            for limit in [3usize, 100] {
                let hits = v.search(&t, &scope(f.clone()), query, limit).await.unwrap();
                assert_eq!(hits.len(), expected.min(limit), "{f} limit {limit}");
                for (id, _) in &hits {
                    assert!(want(by_id[id]), "{f}: turn {} passed", by_id[id].position);
                }
            }
        }
        assert_eq!(
            v.count(&t, &scope(f.clone())).await.unwrap(),
            expected as u64,
            "{f}"
        );
    }
    // Keyword points belong to conversations: a turn filter does not hide them.
    v.upsert_keywords(
        &t,
        "f",
        vec![KeywordVector {
            keyword: "kayak".into(),
            vector: vector(dim, 3).into(),
        }],
    )
    .await
    .unwrap();
    let kw = v
        .search_keywords(
            &t,
            &scope(serde_json::json!({"user_ids": ["u-1"]})),
            &vector(dim, 3),
            5,
            0.5,
        )
        .await
        .unwrap();
    assert_eq!(kw.len(), 1);
    v.delete_conversation(&t, "f").await.unwrap();
    assert_eq!(v.count(&t, &Scope::all()).await.unwrap(), 0);
}

/// Token vectors of `rows` rows, each one of [`vector`]'s, seeded from `seed` on.
fn token_rows(dim: usize, seed: usize, rows: usize) -> TokenVectors {
    TokenVectors::new(dim, (0..rows).flat_map(|r| vector(dim, seed + r)).collect()).unwrap()
}

/// The late-interaction contract, for an index opened with token vectors of `late_dim`
/// values a row: MaxSim of the question's rows against each named turn's, within the tenant,
/// for current turns that have them; kept across an edit's copy; gone with the turn.
pub async fn late_contract(v: Arc<dyn VectorIndex>, dim: usize, late_dim: usize) {
    let a = TenantId("late-a".into());
    let b = TenantId("late-b".into());
    let point = |t: &TenantId, i: usize, late: Option<TokenVectors>| TurnPoint {
        memory_id: MemoryId::derive(t, "late", &i.to_string()),
        tenant: t.clone(),
        conversation_id: "late".into(),
        turn_id: i.to_string(),
        position: i as u64,
        timestamp: Utc::now(),
        recorded_at: Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap(),
        user_speaker: None,
        assistant_speaker: None,
        user: vector(dim, i),
        assistant: None,
        lexical: SparseVector::default(),
        user_id: None,
        agent_id: None,
        metadata: Default::default(),
        late,
    };
    // Turn i holds rows seeded 10i..10i+4; turn 3 has none; tenant B holds turn 1's rows.
    let pts: Vec<TurnPoint> = (0..4)
        .map(|i| point(&a, i, (i != 3).then(|| token_rows(late_dim, 10 * i, 5))))
        .collect();
    v.upsert_turns(pts.clone()).await.unwrap();
    v.upsert_turns(vec![point(&b, 1, Some(token_rows(late_dim, 10, 5)))])
        .await
        .unwrap();
    let ids: Vec<MemoryId> = pts.iter().map(|p| p.memory_id).collect();
    let question = token_rows(late_dim, 11, 3);
    let scores = v.late_scores(&a, &question, &ids).await.unwrap();
    // Every question row is one of turn 1's: a mean best cosine of 1 (f16 storage allows a
    // little less).
    assert!((scores[&ids[1]] - 1.0).abs() < 1e-2, "{scores:?}");
    for (p, id) in pts.iter().zip(&ids).take(3) {
        let want = p.late.as_ref().unwrap().max_sim(&question);
        assert!((scores[id] - want).abs() < 1e-2, "{scores:?} vs {want}");
    }
    assert!(scores[&ids[0]] < scores[&ids[1]]);
    assert!(!scores.contains_key(&ids[3]), "no token vectors, no score");
    assert_eq!(scores.len(), 3);
    // Another tenant's id is never scored.
    let other = MemoryId::derive(&b, "late", "1");
    assert!(v
        .late_scores(&a, &question, &[other])
        .await
        .unwrap()
        .is_empty());
    assert!(v.late_scores(&a, &question, &[]).await.unwrap().is_empty());
    // Sentences: turn 5's rows are [CLS] (shared), two rows of sentence 1, two of sentence 2.
    // A question of one row from each sentence matches the whole turn fully, no one sentence.
    let labels = vec![
        Segment::new(0, 0),
        Segment::new(0, 1),
        Segment::new(0, 1),
        Segment::new(0, 2),
        Segment::new(0, 2),
    ];
    let split = token_rows(late_dim, 50, 5).with_segments(labels).unwrap();
    v.upsert_turns(vec![point(&a, 5, Some(split.clone()))])
        .await
        .unwrap();
    let spread = TokenVectors::new(
        late_dim,
        [vector(late_dim, 51), vector(late_dim, 53)].concat(),
    )
    .unwrap();
    let five = MemoryId::derive(&a, "late", "5");
    let mut with_five = ids.clone();
    with_five.push(five);
    let sentences = v.sentence_scores(&a, &spread, &with_five).await.unwrap();
    let want = split.sentence_max_sim(&spread).unwrap();
    assert!(
        want < 0.99 && (sentences[&five] - want).abs() < 1e-2,
        "{sentences:?} vs {want}"
    );
    assert!(
        (v.late_scores(&a, &spread, &[five]).await.unwrap()[&five] - 1.0).abs() < 1e-2,
        "the whole turn holds both rows"
    );
    assert_eq!(
        sentences.len(),
        1,
        "turns stored without sentences are left out"
    );
    assert!(v
        .sentence_scores(&b, &spread, &[five])
        .await
        .unwrap()
        .is_empty());
    v.delete_turns(&a, "late", &[five], &[]).await.unwrap();
    assert!(v
        .sentence_scores(&a, &spread, &[five])
        .await
        .unwrap()
        .is_empty());
    // A late search ranks the scope's turns by the same MaxSim, best first, within the tenant
    // and the scope; turns without token vectors are not found.
    let late = VectorQuery::Late(question.clone());
    let found = v.search(&a, &Scope::all(), &late, 10).await.unwrap();
    let order: Vec<MemoryId> = found.iter().map(|(m, _)| *m).collect();
    assert_eq!(order.len(), 3, "{found:?}");
    assert_eq!(order[0], ids[1]);
    assert!(!order.contains(&ids[3]) && !order.contains(&other));
    assert!((found[0].1 - 1.0).abs() < 1e-2, "{found:?}");
    for (m, s) in &found {
        assert!((s - scores[m]).abs() < 1e-3, "{found:?} vs {scores:?}");
    }
    assert!(found.windows(2).all(|w| w[0].1 >= w[1].1));
    assert_eq!(
        v.search(&a, &Scope::all(), &late, 1).await.unwrap().len(),
        1
    );
    assert!(v
        .search(&a, &Scope::of(&["another"]), &late, 10)
        .await
        .unwrap()
        .is_empty());
    let wide = VectorQuery::Late(token_rows(late_dim + 1, 0, 2));
    let e = v.search(&a, &Scope::all(), &wide, 10).await.unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)), "{e}");
    // A question of another width is refused.
    let e = v
        .late_scores(&a, &token_rows(late_dim + 1, 0, 2), &ids)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)), "{e}");
    // An edit keeps the old version's points (token vectors too) and scores the new one.
    edit(
        &*v,
        &a,
        &pts[2],
        point(&a, 2, Some(token_rows(late_dim, 11, 3))),
    )
    .await;
    let scores = v.late_scores(&a, &question, &ids).await.unwrap();
    assert!((scores[&ids[2]] - 1.0).abs() < 1e-2, "{scores:?}");
    // Gone with their turns.
    v.delete_turns(&a, "late", &ids, &[]).await.unwrap();
    assert!(v.late_scores(&a, &question, &ids).await.unwrap().is_empty());
    v.delete_conversation(&b, "late").await.unwrap();
}

/// An edit as the graph writer makes one: the points of `old` kept as a version, `new` written
/// as recorded now.
async fn edit(v: &dyn VectorIndex, t: &TenantId, old: &TurnPoint, mut new: TurnPoint) {
    v.keep_versions(
        t,
        &[ReplacedVersion {
            memory_id: old.memory_id,
            recorded_at: old.recorded_at,
            expired_at: Utc::now(),
        }],
    )
    .await
    .unwrap();
    new.recorded_at = Utc::now();
    v.upsert_turns(vec![new]).await.unwrap();
}

/// An index opened without token vectors takes turns that carry them (an embedder with
/// `embedder.late_model` ahead of a writer without it) and scores none.
pub async fn plain_index_ignores_token_vectors(v: Arc<dyn VectorIndex>, dim: usize) {
    let t = TenantId("plain".into());
    let p = TurnPoint {
        memory_id: MemoryId::derive(&t, "no-late", "0"),
        tenant: t.clone(),
        conversation_id: "no-late".into(),
        turn_id: "0".into(),
        position: 0,
        timestamp: Utc::now(),
        user_speaker: None,
        assistant_speaker: None,
        user: vector(dim, 1),
        assistant: None,
        lexical: SparseVector::default(),
        user_id: None,
        agent_id: None,
        metadata: Default::default(),
        recorded_at: Utc::now(),
        late: Some(token_rows(8, 0, 3)),
    };
    v.upsert_turns(vec![p.clone()]).await.unwrap();
    assert!(v
        .late_scores(&t, &token_rows(8, 0, 3), &[p.memory_id])
        .await
        .unwrap()
        .is_empty());
    let late = VectorQuery::Late(token_rows(8, 0, 3));
    assert!(v
        .search(&t, &Scope::all(), &late, 5)
        .await
        .unwrap()
        .is_empty());
    v.delete_conversation(&t, "no-late").await.unwrap();
}

pub async fn vector_contract(v: Arc<dyn VectorIndex>, dim: usize) {
    vector_filters(v.clone(), dim).await;
    vector_versions(v.clone(), dim).await;
    vector_lexical_pruning(v.clone(), dim).await;
    vector_ties(v.clone(), dim).await;
    vector_keyword_forms(v.clone(), dim).await;
    vector_keyword_many_forms(v.clone(), dim).await;
    let a = TenantId("tenant-a".into());
    let b = TenantId("tenant-b".into());
    let point = |t: &TenantId, conv: &str, i: usize| TurnPoint {
        memory_id: MemoryId::derive(t, conv, &i.to_string()),
        tenant: t.clone(),
        conversation_id: conv.into(),
        turn_id: i.to_string(),
        position: i as u64,
        timestamp: Utc::now(),
        recorded_at: Utc::now(),
        user_speaker: Some("Zoë".into()),
        assistant_speaker: None,
        user: vector(dim, i),
        assistant: (!i.is_multiple_of(3)).then(|| vector(dim, i + 1000)),
        lexical: SparseVector {
            indices: vec![i as u32, 99_999],
            values: vec![1.0, 0.5],
        },
        user_id: None,
        agent_id: None,
        metadata: Default::default(),
        late: None,
    };
    for size in [1usize, 10, 1000, 10_000] {
        let pts: Vec<TurnPoint> = (0..size)
            .map(|i| point(&a, &format!("size-{size}"), i))
            .collect();
        v.upsert_turns(pts.clone()).await.unwrap();
        v.upsert_turns(pts).await.unwrap();
        assert_eq!(
            v.count(&a, &Scope::of(&[&format!("size-{size}")]))
                .await
                .unwrap(),
            size as u64
        );
    }
    let pts: Vec<TurnPoint> = (0..20).map(|i| point(&a, "c1", i)).collect();
    v.upsert_turns(pts.clone()).await.unwrap();
    v.upsert_turns(vec![point(&b, "c1", 7)]).await.unwrap();

    // The user field of turn 7 is found by its own vector, in tenant A's scope only.
    let q = VectorQuery::Dense {
        field: VectorField::User,
        vector: vector(dim, 7),
    };
    let hits = v.search(&a, &Scope::of(&["c1"]), &q, 3).await.unwrap();
    assert_eq!(hits[0].0, pts[7].memory_id);
    assert!((hits[0].1 - 1.0).abs() < 1e-3);
    let hb = v.search(&b, &Scope::all(), &q, 50).await.unwrap();
    assert_eq!(hb.len(), 1);
    assert_ne!(hb[0].0, pts[7].memory_id);
    let qa = VectorQuery::Dense {
        field: VectorField::Assistant,
        vector: vector(dim, 1005),
    };
    assert_eq!(
        v.search(&a, &Scope::of(&["c1"]), &qa, 1).await.unwrap()[0].0,
        pts[5].memory_id
    );
    let lex = VectorQuery::Lexical(SparseVector {
        indices: vec![11],
        values: vec![1.0],
    });
    let lh = v.search(&a, &Scope::of(&["c1"]), &lex, 5).await.unwrap();
    assert_eq!(lh.len(), 1);
    assert_eq!(lh[0].0, pts[11].memory_id);
    let fv = v
        .field_vectors(&a, &[pts[3].memory_id, pts[4].memory_id])
        .await
        .unwrap();
    assert!(fv[&pts[3].memory_id].assistant.is_none());
    assert!(fv[&pts[4].memory_id].assistant.is_some());
    assert!(v
        .field_vectors(&b, &[pts[3].memory_id])
        .await
        .unwrap()
        .is_empty());

    // Keyword neighbours, per conversation, with a cosine floor.
    let kws = vec![
        KeywordVector {
            keyword: "dog".into(),
            vector: vector(dim, 1).into(),
        },
        KeywordVector {
            keyword: "café \"ü\"".into(),
            vector: vector(dim, 2).into(),
        },
    ];
    v.upsert_keywords(&a, "c1", kws.clone()).await.unwrap();
    v.upsert_keywords(&a, "c1", kws).await.unwrap();
    let near = v
        .search_keywords(&a, &Scope::of(&["c1"]), &vector(dim, 1), 30, 0.99)
        .await
        .unwrap();
    assert_eq!(near, vec![("dog".to_string(), near[0].1)]);
    assert!(v
        .search_keywords(&b, &Scope::all(), &vector(dim, 1), 30, 0.0)
        .await
        .unwrap()
        .is_empty());
    assert!(v
        .search_keywords(&a, &Scope::of(&["c2"]), &vector(dim, 1), 30, 0.0)
        .await
        .unwrap()
        .is_empty());

    // A writer's batch: several conversations (of two tenants) in one call; a keyword a
    // conversation already has stays one point, a new one is added beside it.
    let kw = |k: &str, seed| KeywordVector {
        keyword: k.into(),
        vector: vector(dim, seed).into(),
    };
    let sets = vec![
        KeywordSet {
            tenant: a.clone(),
            conversation: "ks1".into(),
            keywords: vec![kw("kayak", 7), kw("tent", 8)],
        },
        KeywordSet {
            tenant: b.clone(),
            conversation: "ks2".into(),
            keywords: vec![kw("kayak", 7)],
        },
    ];
    v.upsert_keyword_sets(sets).await.unwrap();
    v.upsert_keyword_sets(vec![KeywordSet {
        tenant: a.clone(),
        conversation: "ks1".into(),
        keywords: vec![kw("kayak", 7), kw("stove", 9)],
    }])
    .await
    .unwrap();
    let mut in_ks1: Vec<String> = v
        .search_keywords(&a, &Scope::of(&["ks1"]), &vector(dim, 7), 30, -1.0)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    in_ks1.sort();
    assert_eq!(in_ks1, ["kayak", "stove", "tent"]);
    let in_ks2 = v
        .search_keywords(&b, &Scope::of(&["ks2"]), &vector(dim, 7), 30, -1.0)
        .await
        .unwrap();
    assert_eq!(in_ks2.len(), 1);
    assert_eq!(in_ks2[0].0, "kayak");
    assert!(in_ks2[0].1 > 0.99);
    // A bad vector in any set refuses the batch.
    assert!(matches!(
        v.upsert_keyword_sets(vec![KeywordSet {
            tenant: a.clone(),
            conversation: "ks1".into(),
            keywords: vec![KeywordVector {
                keyword: "short".into(),
                vector: vec![0.5; dim - 1].into(),
            }],
        }])
        .await,
        Err(StoreError::Invalid(_))
    ));

    // Several vectors at once: each list is the one its own search gives, in the vectors'
    // order, over every conversation of the scope; a vector of the wrong width is refused.
    let both = Scope::of(&["ks1", "c1"]);
    let probes = vec![vector(dim, 7), vector(dim, 1), vector(dim, 9)];
    for (tenant, scope) in [(&a, &both), (&b, &Scope::all())] {
        let many = v
            .search_keywords_many(tenant, scope, &probes, 2, -1.0)
            .await
            .unwrap();
        assert_eq!(many.len(), probes.len());
        for (probe, hits) in probes.iter().zip(&many) {
            let one = v
                .search_keywords(tenant, scope, probe, 2, -1.0)
                .await
                .unwrap();
            assert_eq!(hits.len(), one.len());
            for (h, o) in hits.iter().zip(&one) {
                assert_eq!(h.0, o.0);
                assert!((h.1 - o.1).abs() < 1e-4, "{h:?} against {o:?}");
            }
        }
    }
    let many = v
        .search_keywords_many(&a, &both, &probes, 2, -1.0)
        .await
        .unwrap();
    assert_eq!(many[0][0].0, "kayak");
    assert_eq!(many[1][0].0, "dog");
    assert_eq!(many[2][0].0, "stove");
    assert!(v
        .search_keywords_many(&a, &both, &[], 2, -1.0)
        .await
        .unwrap()
        .is_empty());
    assert!(v
        .search_keywords_many(&a, &both, &[vector(dim, 1), vec![0.5; dim - 1]], 2, -1.0)
        .await
        .is_err());

    // Erasure.
    assert_eq!(v.delete_conversation(&a, "c1").await.unwrap(), 20);
    assert_eq!(v.count(&a, &Scope::of(&["c1"])).await.unwrap(), 0);
    assert!(v
        .search(&a, &Scope::of(&["c1"]), &q, 5)
        .await
        .unwrap()
        .is_empty());
    assert!(v
        .search_keywords(&a, &Scope::of(&["c1"]), &vector(dim, 1), 30, 0.0)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(v.count(&b, &Scope::of(&["c1"])).await.unwrap(), 1);

    // Deletion by id (a writer undoing erased turns): those turns and keywords only.
    let d: Vec<TurnPoint> = (0..4).map(|i| point(&a, "d1", i)).collect();
    v.upsert_turns(d.clone()).await.unwrap();
    let kw = |k: &str, seed: usize| KeywordVector {
        keyword: k.into(),
        vector: vector(dim, seed).into(),
    };
    v.upsert_keywords(&a, "d1", vec![kw("dog", 1), kw("cat", 2)])
        .await
        .unwrap();
    v.delete_turns(&a, "d1", &[d[0].memory_id, d[1].memory_id], &["dog".into()])
        .await
        .unwrap();
    assert_eq!(v.count(&a, &Scope::of(&["d1"])).await.unwrap(), 2);
    let left = v
        .field_vectors(&a, &[d[0].memory_id, d[2].memory_id])
        .await
        .unwrap();
    assert!(!left.contains_key(&d[0].memory_id) && left.contains_key(&d[2].memory_id));
    let names = |hits: Vec<(String, f32)>| hits.into_iter().map(|h| h.0).collect::<Vec<_>>();
    assert_eq!(
        names(
            v.search_keywords(&a, &Scope::of(&["d1"]), &vector(dim, 2), 30, 0.0)
                .await
                .unwrap()
        ),
        vec!["cat".to_string()]
    );
    assert_eq!(v.delete_conversation(&a, "d1").await.unwrap(), 2);
    // Wrong dimensions are refused, not stored.
    let mut bad = point(&a, "c9", 1);
    bad.user = vec![1.0; dim + 1];
    assert!(v.upsert_turns(vec![bad]).await.is_err());
    assert_eq!(v.count(&a, &Scope::of(&["c9"])).await.unwrap(), 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EdgeVectorIndex, EmbeddedGraph};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_graph_passes_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let g = EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap();
        let direct = g.clone();
        let residue: Residue = Arc::new(move |t, c| {
            let g = direct.clone();
            Box::pin(async move { g.residue(&t, &c).unwrap() })
        });
        graph_contract(Arc::new(g), residue).await;
    }

    /// Bolt server settings from RECOLLECT_TEST_BOLT_URI (+ _USER, _PASSWORD, _DATABASE), set by
    /// scripts/test.sh after it starts ArcadeDB. Missing: a failure when REQUIRE_ARCADEDB=1
    /// (the test script), a printed skip otherwise (a developer's `cargo test`).
    fn bolt_settings() -> Option<crate::Neo4jSettings> {
        let var = |k: &str| std::env::var(format!("RECOLLECT_TEST_BOLT_{k}")).ok();
        match var("URI") {
            Some(uri) => Some(crate::Neo4jSettings {
                uri,
                user: var("USER").unwrap_or_else(|| "root".into()),
                password: var("PASSWORD").unwrap_or_default(),
                database: var("DATABASE").unwrap_or_else(|| "recollect".into()),
                ca_file: var("CA_FILE").unwrap_or_default(),
            }),
            None => {
                assert!(
                    std::env::var("REQUIRE_ARCADEDB").as_deref() != Ok("1"),
                    "REQUIRE_ARCADEDB=1 but RECOLLECT_TEST_BOLT_URI is unset: the Bolt server \
                     did not start"
                );
                eprintln!(
                    "SKIPPED: Neo4j adapter contract needs a Bolt server; run scripts/test.sh \
                     (starts ArcadeDB) or set RECOLLECT_TEST_BOLT_URI/_USER/_PASSWORD/_DATABASE"
                );
                None
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn neo4j_graph_passes_the_contract() {
        let Some(settings) = bolt_settings() else {
            return;
        };
        let g = Arc::new(crate::Neo4jGraph::connect(&settings).await.unwrap());
        let direct = g.clone();
        let residue: Residue = Arc::new(move |t, c| {
            let g = direct.clone();
            Box::pin(async move { g.residue(&t, &c).await.unwrap().values().sum() })
        });
        graph_contract(g, residue).await;
    }

    /// A graph written before Conversation nodes existed: a service of this version connecting
    /// to it writes them once, and the listing holds every conversation again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn neo4j_conversations_written_before_their_nodes_are_listed() {
        use crate::graph::GraphRead;
        let Some(settings) = bolt_settings() else {
            return;
        };
        let g = crate::Neo4jGraph::connect(&settings).await.unwrap();
        let t = TenantId(format!("tenant-listed-{}", uuid::Uuid::new_v4().simple()));
        for c in ["b", "a"] {
            g.write_turns(&[(turn(&t, c, 0, "hello"), extraction(&["hi"], "Zoë", 1))])
                .await
                .unwrap();
        }
        g.forget_conversation_nodes(&t).await.unwrap();
        assert!(
            g.conversations(&t).await.unwrap().is_empty(),
            "an older graph"
        );
        let upgraded = crate::Neo4jGraph::connect(&settings).await.unwrap();
        assert_eq!(
            upgraded.conversations(&t).await.unwrap(),
            vec!["a".to_string(), "b".to_string()]
        );
    }

    /// The Qdrant server scripts/test.sh started (QDRANT_URL). Missing: a failure when
    /// REQUIRE_QDRANT=1 (the test script said the server is there), a printed skip otherwise.
    fn qdrant_url(what: &str) -> Option<String> {
        let Ok(url) = std::env::var("QDRANT_URL") else {
            assert!(
                std::env::var("REQUIRE_QDRANT").as_deref() != Ok("1"),
                "REQUIRE_QDRANT=1 but QDRANT_URL is unset: the Qdrant server did not start"
            );
            eprintln!(
                "SKIPPED: {what} skipped because QDRANT_URL is unset; run scripts/test.sh \
                 (starts Qdrant when scripts/qdrant.sh installed it) or set QDRANT_URL to a \
                 server's gRPC address (e.g. http://127.0.0.1:6334)"
            );
            return None;
        };
        Some(url)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn qdrant_vectors_pass_the_contract() {
        let Some(url) = qdrant_url("Qdrant adapter contract") else {
            return;
        };
        // Fresh collections per run, so a long-lived server holds no earlier state.
        let prefix = format!("contract_{}", uuid::Uuid::new_v4().simple());
        let v = Arc::new(
            crate::QdrantVectorIndex::connect(&url, &prefix, 32)
                .await
                .unwrap(),
        );
        vector_contract(v.clone(), 32).await;
        plain_index_ignores_token_vectors(v.clone(), 32).await;
        let a = TenantId("tenant-a".into());
        assert_eq!(v.keyword_count(&a, &Scope::of(&["c1"])).await.unwrap(), 0);
        // With token vectors: both contracts on their own collections; the plain ones are
        // refused for them, naming the way out.
        let settings = crate::QdrantSettings {
            url: url.clone(),
            api_key: String::new(),
        };
        let e = crate::QdrantVectorIndex::connect_shaped(&settings, &prefix, 32, Some(16))
            .await
            .err()
            .expect("no token vectors there");
        assert!(e.to_string().contains("recollect reindex"), "{e}");
        // Wanted where possible (`embedder.late_model = "auto"`): the plain collections are
        // used without them; new ones are made with them.
        use crate::TokenVectorsWanted::WherePossible;
        let plain =
            crate::QdrantVectorIndex::connect_shaped(&settings, &prefix, 32, WherePossible(16))
                .await
                .expect("used without them");
        assert_eq!(plain.holds_token_vectors(), Some(false));
        let late_prefix = format!("{prefix}_late");
        let late = Arc::new(
            crate::QdrantVectorIndex::connect_shaped(
                &settings,
                &late_prefix,
                32,
                WherePossible(16),
            )
            .await
            .unwrap(),
        );
        assert_eq!(late.holds_token_vectors(), Some(true));
        vector_contract(late.clone(), 32).await;
        late_contract(late, 32, 16).await;
        // Another model's width is refused at start, as the embedded index refuses it, and
        // the collections are left as they were.
        let e = crate::QdrantVectorIndex::connect(&url, &prefix, 64)
            .await
            .err()
            .expect("refused");
        let message = e.to_string();
        assert!(matches!(e, StoreError::Invalid(_)), "{message}");
        assert!(
            message.contains("32-dimension") && message.contains("gives 64"),
            "{message}"
        );
        let again = crate::QdrantVectorIndex::connect(&url, &prefix, 32)
            .await
            .unwrap();
        assert_eq!(
            again.keyword_count(&a, &Scope::of(&["c1"])).await.unwrap(),
            0
        );
    }

    /// Token vectors in a collection of their own that the server's optimiser never indexes;
    /// they go with their turns (versions, edits, erasures, late interaction turned off), and
    /// collections made before it, with token vectors in the turn points, work as they did.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn qdrant_token_vectors_live_in_their_own_collection_and_go_with_their_turns() {
        use crate::vector::qdrant::{keywords_collection, scope_filter, turns_collection};
        use crate::vector::{history_tenant, LATE_VECTOR};
        use qdrant_client::qdrant::{vectors_config::Config, CountPointsBuilder};
        let Some(url) = qdrant_url("Qdrant token collection test") else {
            return;
        };
        let settings = crate::QdrantSettings {
            url: url.clone(),
            api_key: String::new(),
        };
        let client = qdrant_client::Qdrant::from_url(&url).build().unwrap();
        let prefix = format!("tokens_{}", uuid::Uuid::new_v4().simple());
        let v = crate::QdrantVectorIndex::connect_shaped(&settings, &prefix, 32, Some(16))
            .await
            .unwrap();
        let (turns, tokens) = (format!("{prefix}_turns"), format!("{prefix}_tokens"));
        let config = |name: String| {
            let client = &client;
            async move {
                let info = client.collection_info(name).await.unwrap();
                info.result.unwrap().config.unwrap()
            }
        };
        let c = config(tokens.clone()).await;
        assert_eq!(c.optimizer_config.unwrap().indexing_threshold, Some(0));
        let names = |c: qdrant_client::qdrant::CollectionConfig| match c
            .params
            .and_then(|p| p.vectors_config)
            .and_then(|v| v.config)
        {
            Some(Config::ParamsMap(m)) => {
                let mut n: Vec<String> = m.map.into_keys().collect();
                n.sort();
                n
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(names(c), vec![LATE_VECTOR.to_string()]);
        assert_eq!(
            names(config(turns.clone()).await),
            vec!["assistant", "user"]
        );

        let t = TenantId("tokens".into());
        let rows_in = |conversation: &'static str, tenant: String| {
            let (client, tokens) = (&client, tokens.clone());
            async move {
                let f = scope_filter(&TenantId(tenant), &Scope::of(&[conversation]));
                let r = client
                    .count(CountPointsBuilder::new(tokens).filter(f).exact(true))
                    .await
                    .unwrap();
                r.result.unwrap().count
            }
        };
        let point = |conversation: &str, i: usize, late: Option<TokenVectors>| TurnPoint {
            late,
            ..bare_point(&t, conversation, i, vector(32, i), SparseVector::default())
        };
        let mut pts: Vec<TurnPoint> = (0..4)
            .map(|i| point("c", i, Some(token_rows(16, 10 * i, 4))))
            .collect();
        pts.push(point("d", 9, Some(token_rows(16, 90, 4))));
        v.upsert_turns(pts.clone()).await.unwrap();
        assert_eq!(rows_in("c", t.0.clone()).await, 4);
        assert_eq!(rows_in("d", t.0.clone()).await, 1);
        let ids: Vec<MemoryId> = pts.iter().map(|p| p.memory_id).collect();
        // A version without token vectors removes the rows of the one before.
        v.upsert_turns(vec![point("c", 2, None)]).await.unwrap();
        assert_eq!(rows_in("c", t.0.clone()).await, 3);
        let scores = v
            .late_scores(&t, &token_rows(16, 20, 4), &ids)
            .await
            .unwrap();
        assert!(!scores.contains_key(&ids[2]), "{scores:?}");
        assert_eq!(scores.len(), 4, "{scores:?}");
        // An edit keeps the old version's rows, found as of before it.
        let before = Utc::now();
        edit(&v, &t, &pts[1], point("c", 1, Some(token_rows(16, 70, 4)))).await;
        assert_eq!(rows_in("c", history_tenant(&t)).await, 1);
        let old_rows = VectorQuery::Late(token_rows(16, 10, 4));
        let then = v
            .search(
                &t,
                &Scope {
                    as_of: Some(before),
                    ..Scope::of(&["c"])
                },
                &old_rows,
                1,
            )
            .await
            .unwrap();
        assert_eq!(then[0].0, ids[1]);
        assert!((then[0].1 - 1.0).abs() < 1e-2, "{then:?}");
        // Reopened with late interaction off, the collection is still opened, and an erasure
        // reaches it for that conversation only (the kept version too).
        let off = crate::QdrantVectorIndex::connect(&url, &prefix, 32)
            .await
            .unwrap();
        assert_eq!(off.holds_token_vectors(), Some(false));
        assert_eq!(off.delete_conversation(&t, "c").await.unwrap(), 4);
        assert_eq!(rows_in("c", t.0.clone()).await, 0);
        assert_eq!(rows_in("c", history_tenant(&t)).await, 0);
        assert_eq!(rows_in("d", t.0.clone()).await, 1);
        // Another width is refused, naming all three collections.
        let e = crate::QdrantVectorIndex::connect_shaped(&settings, &prefix, 32, Some(8))
            .await
            .err()
            .expect("refused");
        assert!(e.to_string().contains(&tokens), "{e}");

        // Collections made before the tokens collection: token vectors in the turn points,
        // read and written as before, and no tokens collection made.
        let legacy = format!("legacy_{}", uuid::Uuid::new_v4().simple());
        client
            .create_collection(turns_collection(&format!("{legacy}_turns"), 32, Some(16)))
            .await
            .unwrap();
        client
            .create_collection(keywords_collection(&format!("{legacy}_keywords"), 32))
            .await
            .unwrap();
        let old = Arc::new(
            crate::QdrantVectorIndex::connect_shaped(&settings, &legacy, 32, Some(16))
                .await
                .unwrap(),
        );
        assert_eq!(old.holds_token_vectors(), Some(true));
        late_contract(old, 32, 16).await;
        assert!(!client
            .collection_exists(format!("{legacy}_tokens"))
            .await
            .unwrap());
    }

    /// A Qdrant server of scripts/qdrant.sh with its own state, stopped (by PID) on drop.
    struct QdrantServer {
        dir: tempfile::TempDir,
        url: String,
    }

    fn qdrant_script() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/qdrant.sh")
    }

    impl QdrantServer {
        /// None (with the reason printed) when scripts/qdrant.sh has no server installed; a
        /// failure then if REQUIRE_QDRANT=1.
        fn start(env: &[(&str, &str)]) -> Option<Self> {
            let installed = std::process::Command::new("bash")
                .arg(qdrant_script())
                .arg("installed")
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !installed {
                assert!(
                    std::env::var("REQUIRE_QDRANT").as_deref() != Ok("1"),
                    "REQUIRE_QDRANT=1 but scripts/qdrant.sh has no server installed"
                );
                eprintln!(
                    "SKIPPED: needs the Qdrant server of scripts/qdrant.sh, which is not \
                     installed (scripts/qdrant.sh install)"
                );
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            let out = std::process::Command::new("bash")
                .arg(qdrant_script())
                .arg("start")
                .arg(dir.path())
                .envs(env.iter().copied())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "scripts/qdrant.sh start: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let vars = std::fs::read_to_string(dir.path().join("env")).unwrap();
            let url = vars
                .lines()
                .find_map(|l| l.strip_prefix("QDRANT_URL="))
                .expect("QDRANT_URL in the server's env file")
                .to_string();
            Some(Self { dir, url })
        }
    }

    impl Drop for QdrantServer {
        fn drop(&mut self) {
            let _ = std::process::Command::new("bash")
                .arg(qdrant_script())
                .arg("stop")
                .arg(self.dir.path())
                .status();
        }
    }

    /// The API key for real: a server started with QDRANT__SERVICE__API_KEY refuses a client
    /// without the key or with another one, and serves the client that sends it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn qdrant_api_key_is_sent_and_required() {
        let key = format!("key-{}", uuid::Uuid::new_v4().simple());
        let Some(server) = QdrantServer::start(&[("QDRANT__SERVICE__API_KEY", key.as_str())])
        else {
            return;
        };
        let with = |api_key: &str| crate::QdrantSettings {
            url: server.url.clone(),
            api_key: api_key.into(),
        };
        for (what, settings) in [("no key", with("")), ("a wrong key", with("not-the-key"))] {
            let refused = crate::QdrantVectorIndex::connect_with(&settings, "keyed", 8).await;
            let Err(e) = refused else {
                panic!("a client with {what} was served");
            };
            assert!(
                e.to_string().to_lowercase().contains("unauthenticated")
                    || e.to_string().to_lowercase().contains("api key"),
                "{what}: {e}"
            );
        }
        let v = crate::QdrantVectorIndex::connect_with(&with(&key), "keyed", 8)
            .await
            .unwrap();
        let t = TenantId("t".into());
        v.upsert_turns(vec![first_point(&t)]).await.unwrap();
        assert_eq!(v.count(&t, &Scope::all()).await.unwrap(), 1);
    }

    /// TLS for real: a server with a certificate from a private CA (scripts/test-ca.sh) is
    /// refused while the CA is unknown and served once SSL_CERT_FILE names it, the one way to
    /// trust a private CA that qdrant-client (platform roots only) leaves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn qdrant_over_tls_with_a_private_ca() {
        let ca = tempfile::tempdir().unwrap();
        let made = std::process::Command::new("bash")
            .arg(qdrant_script().with_file_name("test-ca.sh"))
            .arg(ca.path())
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "scripts/test-ca.sh: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        let cert = ca.path().join("server.pem");
        let key = ca.path().join("server.key");
        let Some(server) = QdrantServer::start(&[
            ("QDRANT__SERVICE__ENABLE_TLS", "true"),
            ("QDRANT__TLS__CERT", cert.to_str().unwrap()),
            ("QDRANT__TLS__KEY", key.to_str().unwrap()),
        ]) else {
            return;
        };
        assert!(server.url.starts_with("https://"), "{}", server.url);
        let settings = crate::QdrantSettings {
            url: server.url.clone(),
            api_key: String::new(),
        };
        let refused = crate::QdrantVectorIndex::connect_with(&settings, "tls", 8).await;
        assert!(
            refused.is_err(),
            "a certificate of an unknown CA was accepted"
        );
        // The variable is read when a client builds its TLS configuration; no other test in this
        // process connects over TLS, so setting it here changes nothing for them.
        std::env::set_var("SSL_CERT_FILE", ca.path().join("ca.pem"));
        let served = crate::QdrantVectorIndex::connect_with(&settings, "tls", 8).await;
        std::env::remove_var("SSL_CERT_FILE");
        let v = served.unwrap();
        let t = TenantId("t".into());
        assert_eq!(v.count(&t, &Scope::all()).await.unwrap(), 0);
    }

    /// Writes/s per graph adapter: 10,000 turns (`GRAPH_BENCH_TURNS`) in batches of 256 (the
    /// graph writer's batch), 100 a conversation (`GRAPH_BENCH_PER_CONVERSATION`), each with the contract's extraction (3
    /// keywords max, entity, location, time); then the tenant's conversation listing and the
    /// erasure of one conversation, timed.
    /// `cargo test --workspace -- --ignored graph_write_throughput --nocapture`
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement, not a check: prints writes/s per adapter"]
    async fn graph_write_throughput() {
        async fn measure(g: Arc<dyn Graph>) -> f64 {
            let t = TenantId(format!("bench-{}", uuid::Uuid::new_v4().simple()));
            let n: u64 = std::env::var("GRAPH_BENCH_TURNS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(10_000);
            let per: u64 = std::env::var("GRAPH_BENCH_PER_CONVERSATION")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(100);
            let turns: Vec<(Turn, Extraction)> = (0..n)
                .map(|i| {
                    (
                        turn(&t, &format!("c{}", i / per), i, "bench turn"),
                        extraction(&["alpha", "beta", "gamma"], "Zoë", 1 + (i % 28) as u32),
                    )
                })
                .collect();
            let started = std::time::Instant::now();
            for chunk in turns.chunks(256) {
                g.write_turns(chunk).await.unwrap();
            }
            let rate = turns.len() as f64 / started.elapsed().as_secs_f64();
            println!(
                "graph adapter {}: {rate:.0} turns/s ({n} turns, batches of 256)",
                g.kind()
            );
            let mut took = Vec::new();
            for _ in 0..5 {
                let started = std::time::Instant::now();
                let listed = g.conversations(&t).await.unwrap();
                took.push(started.elapsed());
                assert_eq!(listed.len() as u64, n.div_ceil(per));
            }
            took.sort();
            println!(
                "graph adapter {}: conversations() of {} conversations in {:.1} ms (median of 5)",
                g.kind(),
                n.div_ceil(per),
                took[2].as_secs_f64() * 1e3
            );
            // A listing's page of 100 (it asks for one more), from the start and the middle.
            let middle = format!("c{}", n.div_ceil(per) / 2);
            for after in [None, Some(middle.as_str())] {
                let mut took = Vec::new();
                for _ in 0..5 {
                    let started = std::time::Instant::now();
                    let page = g.conversations_after(&t, after, 101).await.unwrap();
                    took.push(started.elapsed());
                    // Ids compare as text ("c10" < "c9"), so count them that way.
                    let later = (0..n.div_ceil(per))
                        .filter(|i| after.is_none_or(|a| format!("c{i}").as_str() > a))
                        .count();
                    assert_eq!(page.len(), later.min(101));
                }
                took.sort();
                println!(
                    "graph adapter {}: conversations_after({after:?}, 101) in {:.1} ms (median of 5)",
                    g.kind(),
                    took[2].as_secs_f64() * 1e3
                );
            }
            // Erasing the first conversation whole.
            let started = std::time::Instant::now();
            let erased = g.delete_conversation(&t, "c0").await.unwrap();
            println!(
                "graph adapter {}: delete_conversation of {erased} turns in {:.2} s",
                g.kind(),
                started.elapsed().as_secs_f64()
            );
            assert_eq!(erased, per.min(n));
            rate
        }
        let dir = tempfile::tempdir().unwrap();
        measure(Arc::new(
            EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap(),
        ))
        .await;
        if let Some(settings) = bolt_settings() {
            measure(Arc::new(
                crate::Neo4jGraph::connect(&settings).await.unwrap(),
            ))
            .await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_vectors_pass_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let v = Arc::new(EdgeVectorIndex::open(dir.path(), 32).unwrap());
        vector_contract(v.clone(), 32).await;
        plain_index_ignores_token_vectors(v, 32).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_vectors_with_token_vectors_pass_both_contracts() {
        let dir = tempfile::tempdir().unwrap();
        let v = Arc::new(
            EdgeVectorIndex::open_shaped(dir.path(), 32, Some(16), crate::Flushes::EachWrite)
                .unwrap(),
        );
        vector_contract(v.clone(), 32).await;
        late_contract(v, 32, 16).await;
    }

    /// MaxSim as the engine computes it (a SIMD kernel of ours for half-precision rows whose
    /// width is a multiple of 8, its generic loop otherwise) agrees with the reference at
    /// widths either side of the kernel's steps, for questions and turns of several lengths.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_max_sim_agrees_with_the_reference_at_every_width() {
        for late_dim in [8, 24, 96, 100] {
            let dir = tempfile::tempdir().unwrap();
            let v = EdgeVectorIndex::open_shaped(
                dir.path(),
                32,
                Some(late_dim),
                crate::Flushes::EachWrite,
            )
            .unwrap();
            let t = TenantId("widths".into());
            let pts: Vec<TurnPoint> = (0..6)
                .map(|i| TurnPoint {
                    memory_id: MemoryId::derive(&t, "c", &i.to_string()),
                    turn_id: i.to_string(),
                    position: i as u64,
                    user: vector(32, i),
                    late: Some(token_rows(late_dim, 7 * i, 1 + 5 * i)),
                    ..first_point(&t)
                })
                .collect();
            v.upsert_turns(pts.clone()).await.unwrap();
            let ids: Vec<MemoryId> = pts.iter().map(|p| p.memory_id).collect();
            for rows in [1, 4, 33] {
                let question = token_rows(late_dim, 3 + rows, rows);
                let scores = v.late_scores(&t, &question, &ids).await.unwrap();
                assert_eq!(scores.len(), ids.len());
                for (p, id) in pts.iter().zip(&ids) {
                    let want = p.late.as_ref().unwrap().max_sim(&question);
                    assert!(
                        (scores[id] - want).abs() < 2e-3,
                        "width {late_dim}, {rows} question rows: {} vs {want}",
                        scores[id]
                    );
                }
            }
        }
    }

    /// Token vectors cannot be added to turns already written: an index made without them is
    /// refused when they are asked for (naming the way out), and one made with them opens
    /// either way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn token_vectors_are_a_property_of_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        drop(EdgeVectorIndex::open(&plain, 8).unwrap());
        let e = EdgeVectorIndex::open_shaped(&plain, 8, Some(16), crate::Flushes::EachWrite)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("recollect reindex"), "{e}");
        EdgeVectorIndex::open(&plain, 8).expect("still opens without them");
        // Wanted where possible (`embedder.late_model = "auto"`): the plain index opens without
        // them and says so; a new one is made with them.
        use crate::TokenVectorsWanted::WherePossible;
        let v =
            EdgeVectorIndex::open_shaped(&plain, 8, WherePossible(16), crate::Flushes::EachWrite)
                .expect("opens without them");
        assert_eq!(v.holds_token_vectors(), Some(false));
        drop(v);
        let new = dir.path().join("new");
        let v = EdgeVectorIndex::open_shaped(&new, 8, WherePossible(16), crate::Flushes::EachWrite)
            .unwrap();
        assert_eq!(v.holds_token_vectors(), Some(true));
        drop(v);
        let v = EdgeVectorIndex::open_shaped(&new, 8, Some(16), crate::Flushes::EachWrite)
            .expect("made with them: opens when they are required");
        assert_eq!(v.holds_token_vectors(), Some(true));
        drop(v);
        let late = dir.path().join("late");
        drop(EdgeVectorIndex::open_shaped(&late, 8, Some(16), crate::Flushes::EachWrite).unwrap());
        let e = EdgeVectorIndex::open_shaped(&late, 8, Some(32), crate::Flushes::EachWrite)
            .err()
            .expect("another width");
        assert!(e.to_string().contains("16"), "{e}");
        let v = EdgeVectorIndex::open(&late, 8).expect("opens without asking for them");
        let t = TenantId("t".into());
        let mut p = first_point(&t);
        p.late = Some(token_rows(16, 0, 2));
        v.upsert_turns(vec![p.clone()]).await.unwrap();
        assert!(v
            .late_scores(&t, &token_rows(16, 0, 2), &[p.memory_id])
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_vectors_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId("t".into());
        {
            let v = EdgeVectorIndex::open(dir.path(), 8).unwrap();
            v.upsert_turns(vec![first_point(&t)]).await.unwrap();
        }
        let v = EdgeVectorIndex::open(dir.path(), 8).unwrap();
        assert_eq!(v.count(&t, &Scope::all()).await.unwrap(), 1);
    }

    /// The single binary's index: writes searchable at once, flushed by `sync`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_vectors_flushed_on_sync_pass_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let v =
            Arc::new(EdgeVectorIndex::open_with(dir.path(), 32, crate::Flushes::OnSync).unwrap());
        vector_contract(v.clone(), 32).await;
        v.sync().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_synced_index_keeps_its_writes_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId("t".into());
        {
            let v = EdgeVectorIndex::open_with(dir.path(), 8, crate::Flushes::OnSync).unwrap();
            v.upsert_turns(vec![first_point(&t)]).await.unwrap();
            v.upsert_keywords(
                &t,
                "c",
                vec![KeywordVector {
                    keyword: "rex".into(),
                    vector: vector(8, 3).into(),
                }],
            )
            .await
            .unwrap();
            assert_eq!(
                v.unflushed_shards(),
                (true, true),
                "written, not yet flushed"
            );
            v.sync().await.unwrap();
            assert_eq!(v.unflushed_shards(), (false, false));
            // Nothing written since: nothing to flush.
            v.sync().await.unwrap();
        }
        let v = EdgeVectorIndex::open(dir.path(), 8).unwrap();
        assert_eq!(v.count(&t, &Scope::all()).await.unwrap(), 1);
        assert_eq!(
            v.search_keywords(&t, &Scope::of(&["c"]), &vector(8, 3), 5, 0.5)
                .await
                .unwrap()
                .len(),
            1
        );
        // Flushing each write, the index has nothing left for `sync`.
        assert_eq!(v.unflushed_shards(), (false, false));
        v.sync().await.unwrap();
    }
}
