//! `VectorIndex` on Qdrant's embedded engine (qdrant-edge): two shards under the data dir,
//! `turns` (named dense `user`/`assistant`, sparse `lexical` with the IDF modifier) and
//! `keywords`, each with keyword payload indexes on tenant (a tenant index) and conversation.
//! A keyword point is stored once per tenant and form (stem + vector), not once per
//! conversation; `keyword_forms.redb` says which forms each conversation said
//! ([`super::keyword_forms`]). The turns' token vectors (late interaction) live in a third
//! shard, `tokens`, that the optimiser never rewrites; stores made before it keep them in
//! their turn points.

use std::collections::HashMap;
use std::path::Path;

use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use qdrant_edge::external::ordered_float::OrderedFloat;
use qdrant_edge::external::uuid::Uuid;
use qdrant_edge::{
    AnyVariants, Condition, CountRequest, DateTimeWrapper, Distance, EdgeConfigBuilder,
    EdgeOptimizersConfig, EdgeShard, EdgeSparseVectorParamsBuilder, EdgeVectorParamsBuilder,
    FieldCondition, Filter, HasIdCondition, HnswIndexConfig, IsEmptyCondition, JsonPath,
    KeywordIndexParams, Match, Modifier, MultiVectorComparator, MultiVectorConfig, NamedQuery,
    PayloadFieldSchema, PayloadSchemaParams, PointId, PointInsertOperations, PointOperations,
    PointStruct, QueryEnum, Range, ScoredPoint, SearchRequest, UpdateOperation, ValueVariants,
    Vector, VectorInternal, VectorStorageDatatype, VectorStructInternal, Vectors,
    WithPayloadInterface, WithVector,
};
use recollect_model::{MemoryId, SparseVector, TenantId, TokenVectors};

use crate::vector::keyword_forms::{KeywordForms, Said};
use crate::vector::{
    history_tenant, version_point_id, FieldVectors, Flushes, KeywordSet, ReplacedVersion,
    TokenVectorsWanted, TurnPoint, VectorIndex, VectorQuery, ASSISTANT_VECTOR, KEYWORD_VECTOR,
    LATE_SEGMENTS, LATE_VECTOR, LEXICAL_VECTOR, USER_VECTOR,
};
use crate::{Scope, StoreError};

pub struct EdgeVectorIndex {
    turns: Arc<EdgeShard>,
    keywords: Arc<EdgeShard>,
    /// The turns' token vectors, when they are not in the turn points (see [`tokens_config`]).
    /// Open whenever the store has it, so an erasure reaches it with late interaction off.
    tokens: Option<Arc<EdgeShard>>,
    /// Which keyword points each conversation says.
    forms: Arc<KeywordForms>,
    /// Held across every change of keyword points and their sayers (and by a backup), so a
    /// form another conversation is just starting to say is never deleted under it.
    keyword_changes: Arc<tokio::sync::Mutex<()>>,
    /// The keyword forms (stem, vector) of recently searched conversations, scanned exactly by
    /// a conversation-scoped keyword search. Asking the engine for a few thousand point ids
    /// resolves each id in every segment; a conversation's payload index no longer holds them.
    form_vectors: Arc<FormVectors>,
    dim: usize,
    /// The width of the turns' token vectors, when the index holds them.
    late_dim: Option<usize>,
    optimizer: Optimizer,
    /// Held by every update + flush: the engine's `flush` panics ("WAL lock acquired") when
    /// another thread holds its WAL lock, which concurrent writers (several graph-writers through
    /// the store service) otherwise cause.
    writes: Arc<parking_lot::Mutex<()>>,
    /// Held by the optimiser while it rewrites segments and by a backup while it copies them.
    files: Arc<parking_lot::Mutex<()>>,
    dir: std::path::PathBuf,
    /// Set when opened with [`Flushes::OnSync`]: which shards hold upserts not yet flushed.
    unflushed: Option<Arc<Unflushed>>,
}

/// The shards written since their last flush.
#[derive(Default)]
struct Unflushed {
    turns: AtomicBool,
    keywords: AtomicBool,
    tokens: AtomicBool,
}

/// Points written before the background optimiser runs (merging small segments, building the
/// HNSW graphs of segments past the engine's indexing threshold), or this long after the last
/// write when fewer came. Without it every point stays in a plain appendable segment and each
/// search is a scan that grows with the store.
const OPTIMIZE_AFTER_POINTS: u64 = 20_000;
const OPTIMIZE_WHEN_IDLE: Duration = Duration::from_secs(5);

/// Write-ahead log segments of 4 MiB instead of the engine's 32: the log is never read back
/// (see [`prune_write_ahead_log`]), and what an open leaves of it is its newest closed segment
/// and the open one, allocated whole: 112 MB for the two shards at 32 MiB.
fn log_options() -> qdrant_edge::WalOptions {
    qdrant_edge::WalOptions {
        segment_capacity: 4 * 1024 * 1024,
        ..Default::default()
    }
}

/// Sixteen segments before the optimiser merges: at the engine's default on 2 cores (2) every
/// optimisation during a bulk ingest rewrote the whole index into one segment again; at four a
/// 1M-turn ingest still spent a quarter of its CPU on merges (1,429 -> 1,827 turns/s at eight,
/// recall p99 29.3 -> 30.5 ms), and at eight 38 % on merges and the per-tenant HNSW graphs
/// they rebuild (2,573 -> 2,938 turns/s at sixteen, recall p99 17.7 -> 20.0 ms; docs/SPEED.md).
/// A search visits every segment, so each one more costs recall a little.
fn optimizer_config() -> EdgeOptimizersConfig {
    EdgeOptimizersConfig {
        default_segment_number: Some(16),
        ..Default::default()
    }
}

/// Every search here is filtered by tenant, so no search walks a graph of all tenants: no
/// global graph (`m: 0`), one graph per tenant instead (`payload_m`, built for the tenant
/// index and for any conversation or end user large enough that scanning it is slower).
/// Scopes under `full_scan_threshold` (a conversation, a few of them) are scanned exactly
/// through the payload index, as before. Building the global graph was half of the background
/// index build that competed with ingest. A store written with the global graph is rebuilt to
/// this once by the optimiser (its configuration no longer matches).
fn graph_config() -> HnswIndexConfig {
    HnswIndexConfig {
        m: 0,
        payload_m: Some(16),
        ef_construct: 100,
        full_scan_threshold: 10_000,
        max_indexing_threads: 0,
        on_disk: Some(false),
        inline_storage: None,
    }
}

/// A turn's token vectors: compared by MaxSim, stored as f16 on disk (most of a turn's bytes
/// when present), and never in a graph: recall scores the turns it names, or scans a scope it
/// has counted small enough (`recall.late_scan_max_turns`).
fn late_params(dim: usize) -> qdrant_edge::EdgeVectorParams {
    EdgeVectorParamsBuilder::new(dim, Distance::Cosine)
        .multivector_config(MultiVectorConfig {
            comparator: MultiVectorComparator::MaxSim,
        })
        .datatype(VectorStorageDatatype::Float16)
        .on_disk(true)
        .hnsw_config(no_graph())
        .build()
}

/// No graph at all, global or per tenant: for token vectors, which are only scored by id or
/// scanned over a small scope.
fn no_graph() -> HnswIndexConfig {
    HnswIndexConfig {
        m: 0,
        payload_m: Some(0),
        ..graph_config()
    }
}

/// The token vectors' own shard: the optimiser never rebuilds it (no index to build, so no
/// indexing threshold), so a turn's ~28 KB of token vectors are written once, where in the
/// turns shard every segment the optimiser built for the dense vectors' per-tenant graphs
/// copied and synced them again (a fifth of a 100k ingest's CPU a turn; docs/SPEED.md,
/// session 27).
/// It keeps one appendable segment; the optimiser only vacuums it after erasures.
fn tokens_config(width: usize) -> qdrant_edge::EdgeConfig {
    EdgeConfigBuilder::new()
        .vector(LATE_VECTOR, late_params(width))
        .hnsw_config(no_graph())
        .optimizers(EdgeOptimizersConfig {
            // 0: never index (the engine reads it as "disabled").
            indexing_threshold: Some(0),
            ..optimizer_config()
        })
        .wal_options(log_options())
        .build()
}

/// The width of the token vectors a shard already holds, if it was made with them.
fn stored_late_dim(path: &Path) -> Result<Option<usize>, StoreError> {
    let file = path.join("edge_config.json");
    if !file.exists() {
        return Ok(None);
    }
    let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(file)?)?;
    Ok(stored["vectors"][LATE_VECTOR]["size"]
        .as_u64()
        .map(|n| n as usize))
}

/// The background optimiser: one thread per index, stopped and joined on drop, so no
/// optimisation outlives the index (a reopen of the same directory never meets one).
struct Optimizer {
    written: Arc<AtomicU64>,
    last_write: Arc<parking_lot::Mutex<Instant>>,
    stop: Arc<AtomicBool>,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Optimizer {
    fn spawn(shards: Vec<Weak<EdgeShard>>, files: Arc<parking_lot::Mutex<()>>) -> Self {
        // 1: the store may have been closed with unoptimised segments; look once after opening.
        let written = Arc::new(AtomicU64::new(1));
        let last_write = Arc::new(parking_lot::Mutex::new(Instant::now()));
        let stop = Arc::new(AtomicBool::new(false));
        let (w, lw, st) = (written.clone(), last_write.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("vector-optimizer".into())
            .spawn(move || {
                lower_priority();
                while !st.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    let n = w.load(Ordering::Relaxed);
                    let idle = lw.lock().elapsed() >= OPTIMIZE_WHEN_IDLE;
                    if n == 0 || (n < OPTIMIZE_AFTER_POINTS && !idle) {
                        continue;
                    }
                    w.fetch_sub(n, Ordering::Relaxed);
                    for shard in &shards {
                        let Some(s) = shard.upgrade() else { return };
                        let started = Instant::now();
                        let _copying_waits = files.lock();
                        match s.optimize() {
                            Ok(true) => tracing::info!(
                                points_since_last = n,
                                secs = started.elapsed().as_secs_f64(),
                                "vector index optimised"
                            ),
                            Ok(false) => {}
                            Err(e) => tracing::warn!(error = %e, "vector index optimisation failed; will retry"),
                        }
                    }
                }
            })
            .ok();
        if thread.is_none() {
            tracing::warn!("no background optimiser thread; searches will scan unindexed segments");
        }
        Self {
            written,
            last_write,
            stop,
            thread: parking_lot::Mutex::new(thread),
        }
    }

    fn wrote(&self, points: usize) {
        self.written.fetch_add(points as u64, Ordering::Relaxed);
        *self.last_write.lock() = Instant::now();
    }
}

/// How much the optimiser's thread yields to the pipeline (nice 0–19). Its merges and index
/// builds were a third of the CPU of a million-turn ingest, taken from the stages that make a
/// turn recallable; niced, it takes the cores' idle time first, and the whole core when idle.
const OPTIMIZER_NICENESS: i32 = 10;

/// Lowers this thread's priority (threads it starts, the engine's index builders, inherit it).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    if let Err(e) =
        rustix::process::setpriority_process(Some(rustix::thread::gettid()), OPTIMIZER_NICENESS)
    {
        tracing::debug!(error = %e, "vector optimiser: priority not lowered");
    }
}

impl Drop for Optimizer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

fn json_path(p: &str) -> JsonPath {
    p.parse().expect("static payload paths are valid")
}

/// The edge engine's errors are not all `Send + Sync`, so only their text is kept.
fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError::backend_msg(e.to_string())
}

fn point_id(id: MemoryId) -> PointId {
    PointId::Uuid(Uuid::from_bytes(id.0))
}

/// A point's payload field as text, where it has one.
fn payload_text<'a>(p: &'a ScoredPoint, key: &str) -> Option<&'a str> {
    p.payload
        .as_ref()
        .and_then(|pl| pl.0.get(key))
        .and_then(|v| v.as_str())
}

fn memory_id(p: &PointId) -> Option<MemoryId> {
    match p {
        PointId::Uuid(u) => Some(MemoryId(*u.as_bytes())),
        PointId::NumId(_) => None,
    }
}

/// The point of a keyword form: its stem and its vector, within the tenant.
fn keyword_form_point(tenant: &TenantId, stem: &str, vector: &[f32]) -> [u8; 16] {
    let h = super::form_hash(vector);
    MemoryId::derive(tenant, "", &format!("keyword:{stem}:{h:016x}")).0
}

fn form_id(point: [u8; 16]) -> PointId {
    PointId::Uuid(Uuid::from_bytes(point))
}

/// Dense field vectors of retrieved points whose tenant key is `owner`, by point id.
fn field_vectors_of(
    recs: Vec<qdrant_edge::Record>,
    owner: &str,
) -> HashMap<MemoryId, FieldVectors> {
    let mut out = HashMap::with_capacity(recs.len());
    for r in recs {
        let tenant = r
            .payload
            .as_ref()
            .and_then(|p| p.0.get("tenant"))
            .and_then(|v| v.as_str());
        if tenant != Some(owner) {
            continue;
        }
        let (Some(id), Some(VectorStructInternal::Named(mut named))) = (memory_id(&r.id), r.vector)
        else {
            continue;
        };
        let dense = |v: Option<VectorInternal>| match v {
            Some(VectorInternal::Dense(d)) => Some(d),
            _ => None,
        };
        let Some(user) = dense(named.remove(USER_VECTOR)) else {
            continue;
        };
        out.insert(
            id,
            FieldVectors {
                user,
                assistant: dense(named.remove(ASSISTANT_VECTOR)),
            },
        );
    }
    out
}

/// A payload's sentence labels (`LATE_SEGMENTS`), None when absent or not small integers.
fn segment_labels(v: Option<&serde_json::Value>) -> Option<Vec<recollect_model::Segment>> {
    v?.as_array()?
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .map(recollect_model::Segment)
        })
        .collect()
}

/// Token vectors as the engine's multivector, checked against the index's width.
fn late_vector(late: &TokenVectors, width: usize) -> Result<Vector, StoreError> {
    if late.dim != width || late.is_empty() {
        return Err(StoreError::Invalid(format!(
            "token vectors of width {} for an index of {width}",
            late.dim
        )));
    }
    Ok(Vector(VectorInternal::MultiDense(
        qdrant_edge::TypedMultiDenseVector {
            flattened_vectors: late.values.clone(),
            dim: width,
        },
    )))
}

fn match_value(key: &str, value: &str) -> Condition {
    Condition::Field(FieldCondition::new_match(
        json_path(key),
        Match::new_value(ValueVariants::String(value.to_string())),
    ))
}

fn shard_count(shard: &EdgeShard, filter: Filter) -> Result<u64, StoreError> {
    Ok(shard
        .count(CountRequest {
            filter: Some(filter),
            exact: true,
        })
        .map_err(err)? as u64)
}

/// Both speakers of a turn in one array, for the `speakers` filter.
fn speakers(p: &TurnPoint) -> Vec<&str> {
    let mut v: Vec<&str> = p.user_speaker.iter().map(String::as_str).collect();
    if p.assistant.is_some() {
        v.extend(p.assistant_speaker.as_deref());
    }
    v
}

fn match_any(key: &str, values: &[String]) -> Condition {
    Condition::Field(FieldCondition::new_match(
        json_path(key),
        Match::new_any(AnyVariants::Strings(values.iter().cloned().collect())),
    ))
}

/// Tenant always; conversations when the scope names them; the turn filter's conditions (on
/// turn points; keyword points carry none of those fields, see [`Scope::conversations_only`]).
/// As of an earlier time: the current points recorded by then (points written before
/// `recorded_at` was kept count as recorded; recall checks each turn's record again).
fn scope_filter(tenant: &TenantId, scope: &Scope) -> Filter {
    let mut f = filter_on(tenant.as_str(), scope);
    if let Some(at) = scope.as_of {
        let recorded_by = Filter {
            should: Some(vec![
                datetime_range("recorded_at", None, Some(at)),
                Condition::IsEmpty(IsEmptyCondition::from(json_path("recorded_at"))),
            ]),
            ..Default::default()
        };
        f.must
            .get_or_insert_with(Vec::new)
            .push(Condition::Filter(recorded_by));
    }
    f
}

/// The kept versions in scope that were current at `at`.
fn history_filter(tenant: &TenantId, scope: &Scope, at: DateTime<Utc>) -> Filter {
    let mut f = filter_on(&history_tenant(tenant), scope);
    let must = f.must.get_or_insert_with(Vec::new);
    must.push(datetime_range("recorded_at", None, Some(at)));
    must.push(Condition::Field(FieldCondition::new_datetime_range(
        json_path("expired_at"),
        Range {
            gt: Some(DateTimeWrapper(at)),
            gte: None,
            lt: None,
            lte: None,
        },
    )));
    f
}

/// `key` within `[from, to]` (either end open when None).
fn datetime_range(key: &str, from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Condition {
    Condition::Field(FieldCondition::new_datetime_range(
        json_path(key),
        Range {
            gte: from.map(DateTimeWrapper),
            lte: to.map(DateTimeWrapper),
            gt: None,
            lt: None,
        },
    ))
}

/// [`scope_filter`]'s conditions under a tenant key (a tenant's, or its kept versions').
fn filter_on(tenant_key: &str, scope: &Scope) -> Filter {
    let mut must = vec![match_value("tenant", tenant_key)];
    if let Some(convs) = &scope.conversations {
        must.push(match_any("conversation", convs));
    }
    let f = &scope.filter;
    for (key, values) in [
        ("user_id", &f.user_ids),
        ("agent_id", &f.agent_ids),
        ("speakers", &f.speakers),
    ] {
        if !values.is_empty() {
            must.push(match_any(key, values));
        }
    }
    if f.from.is_some() || f.to.is_some() {
        must.push(Condition::Field(FieldCondition::new_datetime_range(
            json_path("timestamp"),
            Range {
                gte: f.from.map(DateTimeWrapper),
                lt: f.to.map(DateTimeWrapper),
                gt: None,
                lte: None,
            },
        )));
    }
    for (k, v) in &f.metadata {
        let path = json_path(&format!("metadata.{k}"));
        must.push(Condition::Field(match v {
            serde_json::Value::String(s) => {
                FieldCondition::new_match(path, Match::new_value(ValueVariants::String(s.clone())))
            }
            serde_json::Value::Bool(b) => {
                FieldCondition::new_match(path, Match::new_value(ValueVariants::Bool(*b)))
            }
            // Numbers by value, integer or not (validated finite): a closed one-point range.
            v => {
                let x = OrderedFloat(v.as_f64().unwrap_or(f64::NAN));
                FieldCondition::new_range(
                    path,
                    Range {
                        gte: Some(x),
                        lte: Some(x),
                        gt: None,
                        lt: None,
                    },
                )
            }
        }));
    }
    Filter {
        must: Some(must),
        ..Default::default()
    }
}

/// Removes the closed segments of a shard's write-ahead log but the newest; returns the bytes
/// they took on disk.
///
/// qdrant-edge 0.7.2 writes every update to its log, but never reads the log back (a load
/// rebuilds nothing from it) and never truncates it: the log grew by ~4.6 KB a turn (4.6 GB of
/// a 1M-turn store's 10 GB), and opening it checked the CRC of every entry (most of a 1M store's
/// reopen). What is durable is what a flush wrote to the segments, which every write here ends
/// with, so nothing is lost with the log. Shards are now opened with the log off
/// ([`open_shard`]), so only a store written before has such segments. The newest closed one
/// stays, as it did when the log still numbered the operations (an update numbered below a
/// point's version is ignored; the patched engine numbers them past the segments' versions).
/// Runs before the engine opens the log (it maps every segment it finds).
fn prune_write_ahead_log(shard_dir: &Path) -> Result<u64, StoreError> {
    let mut freed = 0;
    // Oldest first: a crash part way leaves the newest segments, still contiguous.
    for (path, bytes) in stale_log_segments(shard_dir)? {
        std::fs::remove_file(&path)?;
        freed += bytes;
    }
    Ok(freed)
}

/// The closed segments of a shard's write-ahead log but the newest, oldest first, with the
/// bytes each takes on disk: what [`prune_write_ahead_log`] removes and a backup leaves out.
fn stale_log_segments(shard_dir: &Path) -> Result<Vec<(std::path::PathBuf, u64)>, StoreError> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(shard_dir.join("wal")) else {
        return Ok(Vec::new());
    };
    let mut closed: Vec<(u64, std::path::PathBuf, u64)> = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(start) = name
            .to_str()
            .and_then(|n| n.strip_prefix("closed-"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        closed.push((start, entry.path(), entry.metadata()?.blocks() * 512));
    }
    closed.sort_unstable_by_key(|(start, ..)| *start);
    closed.pop();
    Ok(closed
        .into_iter()
        .map(|(_, path, bytes)| (path, bytes))
        .collect())
}

/// `turn_fields`: the shard of turn points, which also gets the end-user and agent indexes.
/// Stores written before keyword forms hold one keyword point per conversation (with a
/// `conversation` payload). Each becomes the point of its form, said by that conversation,
/// once, at open; a crash part way leaves the rest for the next open.
fn migrate_keyword_points(shard: &EdgeShard, forms: &KeywordForms) -> Result<u64, StoreError> {
    let per_conversation = Filter {
        must_not: Some(vec![Condition::IsEmpty(IsEmptyCondition::from(json_path(
            "conversation",
        )))]),
        ..Default::default()
    };
    let mut moved = 0u64;
    loop {
        let (recs, _) = shard
            .scroll(qdrant_edge::ScrollRequest {
                offset: None,
                limit: Some(1000),
                filter: Some(per_conversation.clone()),
                with_payload: Some(WithPayloadInterface::Bool(true)),
                with_vector: WithVector::Selector(vec![KEYWORD_VECTOR.into()]),
                order_by: None,
            })
            .map_err(err)?;
        if recs.is_empty() {
            return Ok(moved);
        }
        let mut old = Vec::with_capacity(recs.len());
        let mut new = Vec::new();
        let mut said: HashMap<String, Vec<Said>> = HashMap::new();
        for r in recs {
            old.push(r.id);
            let field = |k: &str| {
                r.payload
                    .as_ref()
                    .and_then(|p| p.0.get(k))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            };
            let (Some(tenant), Some(conversation), Some(stem)) =
                (field("tenant"), field("conversation"), field("keyword"))
            else {
                continue;
            };
            let Some(VectorStructInternal::Named(mut named)) = r.vector else {
                continue;
            };
            let Some(VectorInternal::Dense(vector)) = named.remove(KEYWORD_VECTOR) else {
                continue;
            };
            let t = TenantId(tenant.clone());
            let point = keyword_form_point(&t, &stem, &vector);
            new.push(keyword_form_struct(&t, &stem, point, vector).into());
            said.entry(tenant).or_default().push(Said {
                conversation,
                stem,
                point,
            });
        }
        // The forms first, then who says them, then the old points: each step repeatable.
        if !new.is_empty() {
            shard
                .update(UpdateOperation::PointOperation(
                    PointOperations::UpsertPoints(PointInsertOperations::PointsList(new)),
                ))
                .map_err(err)?;
        }
        EdgeVectorIndex::flush(shard)?;
        forms.add_by_tenant(&said)?;
        moved += old.len() as u64;
        shard
            .update(UpdateOperation::PointOperation(
                PointOperations::DeletePoints { ids: old },
            ))
            .map_err(err)?;
        EdgeVectorIndex::flush(shard)?;
    }
}

fn keyword_form_struct(
    tenant: &TenantId,
    stem: &str,
    point: [u8; 16],
    vector: Vec<f32>,
) -> PointStruct {
    let payload = serde_json::json!({"tenant": tenant.as_str(), "keyword": stem});
    let vector = Vectors::new_named([(KEYWORD_VECTOR, Vector::new_dense(vector))]);
    PointStruct::new(form_id(point), vector, payload)
}

/// A conversation's keyword forms: (stem, unit vector).
type Forms = Arc<Vec<(String, Vec<f32>)>>;

/// Cached forms of at most this many vectors in all (~150 MB at 384 dimensions).
const CACHED_FORM_VECTORS: usize = 100_000;

/// Cached forms by (tenant, conversation), and how many vectors they hold in all.
#[derive(Default)]
struct Cached(HashMap<(String, String), Forms>, usize);

#[derive(Default)]
struct FormVectors {
    by_conversation: parking_lot::Mutex<Cached>,
    /// Bumped by every change, so a read that raced one is not cached.
    changes: AtomicU64,
}

impl FormVectors {
    fn get(&self, tenant: &str, conversation: &str) -> Option<Forms> {
        let held = self.by_conversation.lock();
        held.0
            .get(&(tenant.to_string(), conversation.to_string()))
            .cloned()
    }

    fn put(&self, tenant: &str, conversation: &str, forms: Forms, read_at: u64) {
        let mut held = self.by_conversation.lock();
        if self.changes.load(Ordering::Acquire) != read_at {
            return;
        }
        if held.1 + forms.len() > CACHED_FORM_VECTORS {
            held.0.clear();
            held.1 = 0;
        }
        held.1 += forms.len();
        held.0
            .insert((tenant.to_string(), conversation.to_string()), forms);
    }

    fn forget(&self, tenant: &str, conversation: &str) {
        let mut held = self.by_conversation.lock();
        self.changes.fetch_add(1, Ordering::AcqRel);
        if let Some(f) = held
            .0
            .remove(&(tenant.to_string(), conversation.to_string()))
        {
            held.1 -= f.len();
        }
    }
}

fn unit(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
    v
}

/// A shard written with vectors of another width (another `embedder.model`) is refused, with
/// the way out, before the engine loads it: the engine's own refusal names neither width.
fn refuse_another_width(path: &Path, config: &qdrant_edge::EdgeConfig) -> Result<(), StoreError> {
    let stored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path.join("edge_config.json"))?)?;
    for (name, params) in &config.vectors {
        let held = stored["vectors"][name.as_str()]["size"].as_u64();
        if let Some(held) = held.filter(|&h| h != params.size as u64) {
            return Err(super::another_width(
                &format!("in {}", path.display()),
                held,
                params.size,
                "move the data directory's vectors/ aside",
            ));
        }
    }
    Ok(())
}

/// The turns shard: both fields' dense vectors and the lexical sparse vector, and the token
/// vectors where a store made before the `tokens` shard holds them there.
fn turns_config(dim: usize, late_in_turns: Option<usize>) -> qdrant_edge::EdgeConfig {
    let mut turns_cfg = EdgeConfigBuilder::new()
        .vector(
            USER_VECTOR,
            EdgeVectorParamsBuilder::new(dim, Distance::Cosine).build(),
        )
        .vector(
            ASSISTANT_VECTOR,
            EdgeVectorParamsBuilder::new(dim, Distance::Cosine).build(),
        );
    // A shard made with token vectors keeps them in its configuration, read or not.
    if let Some(late) = late_in_turns {
        turns_cfg = turns_cfg.vector(LATE_VECTOR, late_params(late));
    }
    turns_cfg
        .sparse_vector(
            LEXICAL_VECTOR,
            EdgeSparseVectorParamsBuilder::new()
                .modifier(Modifier::Idf)
                .build(),
        )
        .hnsw_config(graph_config())
        .optimizers(optimizer_config())
        .wal_options(log_options())
        .build()
}

fn open_shard(
    path: &Path,
    config: qdrant_edge::EdgeConfig,
    turn_fields: bool,
) -> Result<EdgeShard, StoreError> {
    std::fs::create_dir_all(path)?;
    let has_config = path.join("edge_config.json").exists();
    let shard = if has_config {
        refuse_another_width(path, &config)?;
        let freed = prune_write_ahead_log(path)?;
        if freed > 0 {
            tracing::info!(
                shard = %path.display(),
                freed_bytes = freed,
                "removed the vector engine's unread write-ahead log"
            );
        }
        EdgeShard::load(path, Some(config))
    } else {
        EdgeShard::new(path, config)
    };
    let shard = shard.map_err(err)?;
    // The engine never reads its log back; writing it was a CBOR encoding of every vector
    // (~9 % of ingest's CPU at 100k turns). Durable is what a flush puts in the segments, and
    // a crash before it is replayed from the raw store. The patched engine then numbers updates
    // from the segments' versions (scripts/qdrant-edge/unlogged-updates.patch).
    shard.set_write_ahead_log(false);
    // user_id and agent_id: a recall scoped to one end user is a small slice of a tenant,
    // which the planner scans through the index instead of filtering an HNSW walk.
    let fields: &[&str] = if turn_fields {
        &["tenant", "conversation", "user_id", "agent_id"]
    } else {
        &["tenant", "conversation"]
    };
    for &field in fields {
        let params = KeywordIndexParams {
            is_tenant: Some(field == "tenant"),
            ..Default::default()
        };
        shard
            .update(UpdateOperation::FieldIndexOperation(
                qdrant_edge::FieldIndexOperations::CreateIndex(qdrant_edge::CreateIndex {
                    field_name: json_path(field),
                    field_schema: Some(PayloadFieldSchema::FieldParams(
                        PayloadSchemaParams::Keyword(params),
                    )),
                }),
            ))
            .map_err(err)?;
    }
    Ok(shard)
}

impl EdgeVectorIndex {
    pub fn open(dir: &Path, dim: usize) -> Result<Self, StoreError> {
        Self::open_with(dir, dim, Flushes::EachWrite)
    }

    pub fn open_with(dir: &Path, dim: usize, flushes: Flushes) -> Result<Self, StoreError> {
        Self::open_shaped(dir, dim, None, flushes)
    }

    /// [`Self::open_with`], holding token vectors as `late` says (`embedder.late_model`): an
    /// index made without them is refused when they are required (they cannot be added to
    /// turns already written) and opens without them when they are wanted where possible; one
    /// made with them opens either way.
    pub fn open_shaped(
        dir: &Path,
        dim: usize,
        late: impl Into<TokenVectorsWanted>,
        flushes: Flushes,
    ) -> Result<Self, StoreError> {
        let late = late.into();
        let (turns_dir, tokens_dir) = (dir.join("turns"), dir.join("tokens"));
        // Token vectors in the turn points: a store made before they had a shard of their own.
        let in_turns = stored_late_dim(&turns_dir)?;
        let in_tokens = stored_late_dim(&tokens_dir)?;
        let stored_late = in_turns.or(in_tokens);
        let made = turns_dir.join("edge_config.json").exists();
        let late_dim = match (late, stored_late) {
            (TokenVectorsWanted::Required(want), None) if made => {
                return Err(StoreError::Invalid(format!(
                    "the vector index in {} holds no token vectors and embedder.late_model gives \
                     them: move the data directory's vectors/ aside and run `recollect reindex`, \
                     or turn embedder.late_model off ({want}-dimension token vectors)",
                    dir.display()
                )))
            }
            (TokenVectorsWanted::WherePossible(_), None) if made => {
                tracing::info!(
                    index = %dir.display(),
                    "this vector index was made without token vectors: late interaction is off for it \
                     (move the data directory's vectors/ aside and run `recollect reindex` to turn it on)"
                );
                None
            }
            (wanted, Some(held)) if wanted.width().is_some_and(|want| want != held) => {
                let held_in = if in_turns.is_some() {
                    &turns_dir
                } else {
                    &tokens_dir
                };
                return Err(super::another_width(
                    &format!("in {} (token vectors)", held_in.display()),
                    held as u64,
                    wanted.width().unwrap_or_default(),
                    "move the data directory's vectors/ aside",
                ));
            }
            (wanted, _) => wanted.width(),
        };
        let turns_cfg = turns_config(dim, in_turns);
        let kw_cfg = EdgeConfigBuilder::new()
            .vector(
                KEYWORD_VECTOR,
                EdgeVectorParamsBuilder::new(dim, Distance::Cosine).build(),
            )
            .hnsw_config(graph_config())
            .optimizers(optimizer_config())
            .wal_options(log_options())
            .build();
        // A new store with token vectors puts them in their own shard; one that has that shard
        // keeps opening it, whatever embedder.late_model says now. Made before the turns shard,
        // so a store whose turns shard exists has it (a new store stopped between the two would
        // otherwise reopen as one made without token vectors).
        let tokens_width = in_tokens.or(late_dim.filter(|_| in_turns.is_none()));
        let tokens = match tokens_width {
            Some(width) => Some(Arc::new(open_shard(
                &tokens_dir,
                tokens_config(width),
                true,
            )?)),
            None => None,
        };
        let turns = Arc::new(open_shard(&turns_dir, turns_cfg, true)?);
        let keywords = Arc::new(open_shard(&dir.join("keywords"), kw_cfg, false)?);
        let forms = Arc::new(KeywordForms::open(&dir.join("keyword_forms.redb"))?);
        let moved = migrate_keyword_points(&keywords, &forms)?;
        if moved > 0 {
            tracing::info!(
                points = moved,
                "keyword points of conversations made points of forms, said by them"
            );
        }
        let files = Arc::new(parking_lot::Mutex::new(()));
        let mut optimized = vec![Arc::downgrade(&turns), Arc::downgrade(&keywords)];
        optimized.extend(tokens.as_ref().map(Arc::downgrade));
        let optimizer = Optimizer::spawn(optimized, files.clone());
        Ok(Self {
            turns,
            keywords,
            tokens,
            forms,
            keyword_changes: Default::default(),
            form_vectors: Default::default(),
            dim,
            late_dim,
            optimizer,
            writes: Arc::new(parking_lot::Mutex::new(())),
            files,
            dir: dir.to_path_buf(),
            unflushed: (flushes == Flushes::OnSync).then(Default::default),
        })
    }

    /// A conversation's keyword forms with their vectors, from the cache or read once.
    async fn conversation_forms(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<Forms, StoreError> {
        if let Some(f) = self.form_vectors.get(tenant.as_str(), conversation) {
            return Ok(f);
        }
        let read_at = self.form_vectors.changes.load(Ordering::Acquire);
        let (forms, keywords) = (self.forms.clone(), self.keywords.clone());
        let (t, c) = (tenant.0.clone(), conversation.to_string());
        let read: Forms = tokio::task::spawn_blocking(move || {
            let said = forms.said(&t, &c, None)?;
            let stems: HashMap<PointId, String> = said
                .into_iter()
                .map(|s| (form_id(s.point), s.stem))
                .collect();
            let ids: Vec<PointId> = stems.keys().copied().collect();
            let recs = keywords
                .retrieve(
                    &ids,
                    Some(WithPayloadInterface::Bool(false)),
                    Some(WithVector::Selector(vec![KEYWORD_VECTOR.into()])),
                )
                .map_err(err)?;
            let mut out = Vec::with_capacity(recs.len());
            for r in recs {
                let Some(VectorStructInternal::Named(mut named)) = r.vector else {
                    continue;
                };
                let (Some(stem), Some(VectorInternal::Dense(v))) =
                    (stems.get(&r.id), named.remove(KEYWORD_VECTOR))
                else {
                    continue;
                };
                out.push((stem.clone(), unit(v)));
            }
            Ok::<_, StoreError>(Arc::new(out))
        })
        .await??;
        self.form_vectors
            .put(tenant.as_str(), conversation, read.clone(), read_at);
        Ok(read)
    }

    /// A conversation stops saying its keyword forms (all, or those of the given stems): the
    /// forms no other conversation says are deleted first, then who says what is forgotten,
    /// so a crash between the two leaves forms still said, which a repeated erasure deletes.
    async fn unsay(
        &self,
        tenant: &TenantId,
        conversation: &str,
        stems: Option<Vec<String>>,
    ) -> Result<(), StoreError> {
        let _changes = self.keyword_changes.lock().await;
        let (forms, t, c) = (
            self.forms.clone(),
            tenant.0.clone(),
            conversation.to_string(),
        );
        let (said, gone) = tokio::task::spawn_blocking(move || {
            let said = forms.said(&t, &c, stems.as_deref())?;
            let gone = forms.said_by_none_but(&t, &said)?;
            Ok::<_, StoreError>((said, gone))
        })
        .await??;
        if !gone.is_empty() {
            let ids: Vec<PointId> = gone.into_iter().map(form_id).collect();
            self.write(&self.keywords, move |s| {
                s.update(UpdateOperation::PointOperation(
                    PointOperations::DeletePoints { ids },
                ))
                .map_err(err)?;
                Self::flush(s)
            })
            .await?;
        }
        let (forms, t) = (self.forms.clone(), tenant.0.clone());
        let removed = tokio::task::spawn_blocking(move || forms.remove(&t, &said)).await?;
        self.form_vectors.forget(tenant.as_str(), conversation);
        removed
    }

    async fn blocking<T: Send + 'static>(
        shard: &Arc<EdgeShard>,
        f: impl FnOnce(&EdgeShard) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let s = shard.clone();
        tokio::task::spawn_blocking(move || f(&s)).await?
    }

    /// A write of `shard` (update, then flush) under the index's write lock.
    async fn write<T: Send + 'static>(
        &self,
        shard: &Arc<EdgeShard>,
        f: impl FnOnce(&EdgeShard) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (s, writes) = (shard.clone(), self.writes.clone());
        tokio::task::spawn_blocking(move || {
            let _one_writer = writes.lock();
            f(&s)
        })
        .await?
    }

    /// `question` as the engine's query on the token vectors, with the factor that makes its
    /// MaxSim (the engine sums it over the question's tokens) a mean; None where the index holds
    /// no token vectors or the question has none.
    fn late_query(&self, question: &TokenVectors) -> Result<Option<(Vector, f32)>, StoreError> {
        let Some(width) = self.late_dim else {
            return Ok(None);
        };
        if question.is_empty() {
            return Ok(None);
        }
        Ok(Some((
            late_vector(question, width)?,
            1.0 / question.len() as f32,
        )))
    }

    /// Copies the points of `pids` in `shard` that are still the versions being replaced to
    /// their kept versions' points (history search reads them), and flushes.
    fn keep_versions_in(
        s: &EdgeShard,
        pids: &[PointId],
        tenant: &TenantId,
        versions: &[ReplacedVersion],
    ) -> Result<(), StoreError> {
        let recs = s
            .retrieve(
                pids,
                Some(WithPayloadInterface::Bool(true)),
                Some(WithVector::Bool(true)),
            )
            .map_err(err)?;
        let mut keep = Vec::with_capacity(recs.len());
        for r in recs {
            let (Some(id), Some(payload), Some(vectors)) = (memory_id(&r.id), r.payload, r.vector)
            else {
                continue;
            };
            let mut payload = payload.0;
            let Some(v) = versions.iter().find(|v| v.memory_id == id) else {
                continue;
            };
            if payload.get("tenant").and_then(|t| t.as_str()) != Some(tenant.as_str()) {
                continue;
            }
            // The point is still the version being replaced (not yet overwritten by the
            // edit: a redelivery finds the edit's own point here and keeps nothing).
            let recorded = payload
                .get("recorded_at")
                .and_then(|t| t.as_str())
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok());
            if recorded.is_some_and(|r| r != v.recorded_at) {
                continue;
            }
            payload.insert("tenant".into(), history_tenant(tenant).into());
            payload.insert("memory_id".into(), id.to_string().into());
            payload.insert("recorded_at".into(), v.recorded_at.to_rfc3339().into());
            payload.insert("expired_at".into(), v.expired_at.to_rfc3339().into());
            keep.push(
                PointStruct::new(
                    point_id(version_point_id(id, v.recorded_at)),
                    Vectors::from(vectors),
                    serde_json::Value::Object(payload),
                )
                .into(),
            );
        }
        if keep.is_empty() {
            return Ok(());
        }
        // Always flushed: the edit's graph write comes next, and once it is durable a
        // replay finds the new version stored and would not keep the old one again.
        Self::upsert_in(s, keep, None)
    }

    /// Applies deletions to every shard holding turn points, each flushed.
    async fn delete_in_turn_shards(&self, ops: Vec<PointOperations>) -> Result<(), StoreError> {
        for shard in self.turn_shards() {
            let ops = ops.clone();
            self.write(&shard, move |s| Self::update_in(s, ops, None))
                .await?;
        }
        Ok(())
    }

    /// The shard holding the turns' token vectors.
    fn token_shard(&self) -> &Arc<EdgeShard> {
        self.tokens.as_ref().unwrap_or(&self.turns)
    }

    /// The shards holding turn points: the turns shard, and the token vectors' own shard.
    fn turn_shards(&self) -> Vec<Arc<EdgeShard>> {
        std::iter::once(self.turns.clone())
            .chain(self.tokens.clone())
            .collect()
    }

    /// Every shard: those holding turn points, and the keywords'.
    fn shards(&self) -> Vec<Arc<EdgeShard>> {
        let mut all = self.turn_shards();
        all.push(self.keywords.clone());
        all
    }

    fn check_dim(&self, v: &[f32]) -> Result<(), StoreError> {
        if v.len() != self.dim {
            return Err(StoreError::Invalid(format!(
                "vector has {} dimensions, index has {}",
                v.len(),
                self.dim
            )));
        }
        Ok(())
    }

    /// The engine's flush panics instead of waiting when its segment holder is locked for a
    /// write at that moment (the optimiser swapping a rebuilt segment in; seen once in a 1M
    /// ingest). The panic comes before anything is flushed, so trying again shortly is safe,
    /// and cheaper than failing the writer's batch.
    fn flush(shard: &EdgeShard) -> Result<(), StoreError> {
        const ATTEMPTS: u32 = 50;
        for attempt in 1..=ATTEMPTS {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shard.flush())) {
                Ok(()) => return Ok(()),
                Err(_) if attempt < ATTEMPTS => {
                    tracing::warn!(
                        attempt,
                        "vector index busy (segments being swapped); flushing again"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => break,
            }
        }
        Err(StoreError::backend_msg(
            "vector index flush: the segments stayed locked by the optimiser",
        ))
    }

    /// Dense field vectors of the given points whose tenant key is `owner`, by point id.
    async fn dense_vectors(
        &self,
        pids: Vec<PointId>,
        owner: String,
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        Self::blocking(&self.turns, move |s| {
            let recs = s
                .retrieve(
                    &pids,
                    Some(WithPayloadInterface::Fields(vec![json_path("tenant")])),
                    Some(WithVector::Selector(vec![
                        USER_VECTOR.into(),
                        ASSISTANT_VECTOR.into(),
                    ])),
                )
                .map_err(err)?;
            Ok(field_vectors_of(recs, &owner))
        })
        .await
    }

    /// Upserts points into `shard` and flushes it, or only marks it unflushed when given the
    /// shard's flag (the caller holds the write lock).
    fn upsert_in(
        shard: &EdgeShard,
        points: Vec<qdrant_edge::PointStructPersisted>,
        defer: Option<&AtomicBool>,
    ) -> Result<(), StoreError> {
        let upsert = PointOperations::UpsertPoints(PointInsertOperations::PointsList(points));
        Self::update_in(shard, vec![upsert], defer)
    }

    /// Applies point operations to `shard` and flushes it, or only marks it unflushed when
    /// given the shard's flag (the caller holds the write lock).
    fn update_in(
        shard: &EdgeShard,
        ops: Vec<PointOperations>,
        defer: Option<&AtomicBool>,
    ) -> Result<(), StoreError> {
        for op in ops {
            shard
                .update(UpdateOperation::PointOperation(op))
                .map_err(err)?;
        }
        match defer {
            Some(unflushed) => {
                unflushed.store(true, Ordering::Release);
                Ok(())
            }
            None => Self::flush(shard),
        }
    }
}

fn sparse(v: &SparseVector) -> Result<Vector, StoreError> {
    let mut pairs: Vec<(u32, f32)> = v
        .indices
        .iter()
        .copied()
        .zip(v.values.iter().copied())
        .collect();
    pairs.sort_by_key(|p| p.0);
    pairs.dedup_by_key(|p| p.0);
    Vector::try_from(pairs).map_err(err)
}

#[async_trait]
impl VectorIndex for EdgeVectorIndex {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn holds_token_vectors(&self) -> Option<bool> {
        Some(self.late_dim.is_some())
    }

    async fn upsert_turns(&self, points: Vec<TurnPoint>) -> Result<(), StoreError> {
        if points.is_empty() {
            return Ok(());
        }
        let mut structs = Vec::with_capacity(points.len());
        let mut token_structs = Vec::new();
        // Points written without token vectors (an edit while late interaction is off): any
        // an earlier version left in the token shard would be read as this version's.
        let mut without_tokens = Vec::new();
        for p in &points {
            self.check_dim(&p.user)?;
            let mut named: Vec<(String, Vector)> =
                vec![(USER_VECTOR.into(), Vector::new_dense(p.user.clone()))];
            if let Some(a) = &p.assistant {
                self.check_dim(a)?;
                named.push((ASSISTANT_VECTOR.into(), Vector::new_dense(a.clone())));
            }
            if !p.lexical.indices.is_empty() {
                named.push((LEXICAL_VECTOR.into(), sparse(&p.lexical)?));
            }
            let late = match (&p.late, self.late_dim) {
                (Some(late), Some(width)) => Some(late_vector(late, width)?),
                _ => None,
            };
            let mut payload = serde_json::json!({
                "tenant": p.tenant.as_str(),
                "conversation": p.conversation_id,
                "turn_id": p.turn_id,
                "position": p.position,
                "timestamp": p.timestamp.to_rfc3339(),
                "user_speaker": p.user_speaker,
                "assistant_speaker": p.assistant_speaker,
                "speakers": speakers(p),
                "recorded_at": p.recorded_at.to_rfc3339(),
            });
            // Filter fields only when the turn has them: most turns of most deployments carry
            // none, and every payload byte is written, indexed and read back.
            for (k, v) in [("user_id", &p.user_id), ("agent_id", &p.agent_id)] {
                if let Some(v) = v {
                    payload[k] = serde_json::Value::String(v.clone());
                }
            }
            if !p.metadata.is_empty() {
                payload["metadata"] = serde_json::Value::Object(p.metadata.clone());
            }
            let segments = p
                .late
                .as_ref()
                .filter(|l| !l.segments.is_empty())
                .map(|l| serde_json::json!(l.segments));
            match (late, self.tokens.is_some()) {
                (Some(late), true) => {
                    // The same payload, so a scope's filter reads the same in both shards.
                    let mut payload = payload.clone();
                    if let Some(segments) = segments {
                        payload[LATE_SEGMENTS] = segments;
                    }
                    let named = vec![(LATE_VECTOR.to_string(), late)];
                    token_structs.push(
                        PointStruct::new(point_id(p.memory_id), Vectors::new_named(named), payload)
                            .into(),
                    );
                }
                (late, own_shard) => {
                    if let Some(late) = late {
                        named.push((LATE_VECTOR.into(), late));
                    } else if own_shard {
                        without_tokens.push(point_id(p.memory_id));
                    }
                    if let Some(segments) = segments {
                        payload[LATE_SEGMENTS] = segments;
                    }
                }
            }
            structs.push(
                PointStruct::new(point_id(p.memory_id), Vectors::new_named(named), payload).into(),
            );
        }
        let n = structs.len();
        let unflushed = self.unflushed.clone();
        // Token vectors first: a turn point found without them would be scored as one that
        // has none until a replay wrote them.
        let mut token_ops = Vec::new();
        if !without_tokens.is_empty() {
            token_ops.push(PointOperations::DeletePoints {
                ids: without_tokens,
            });
        }
        if !token_structs.is_empty() {
            token_ops.push(PointOperations::UpsertPoints(
                PointInsertOperations::PointsList(token_structs),
            ));
        }
        if let (Some(tokens), false) = (&self.tokens, token_ops.is_empty()) {
            let unflushed = unflushed.clone();
            self.write(tokens, move |s| {
                Self::update_in(s, token_ops, unflushed.as_ref().map(|u| &u.tokens))
            })
            .await?;
        }
        self.write(&self.turns, move |s| {
            Self::upsert_in(s, structs, unflushed.as_ref().map(|u| &u.turns))
        })
        .await?;
        self.optimizer.wrote(n);
        Ok(())
    }

    async fn search(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        query: &VectorQuery,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, StoreError> {
        let mut scale = 1.0;
        let mut shard = &self.turns;
        let (name, vector) = match query {
            VectorQuery::Dense { field, vector } => {
                self.check_dim(vector)?;
                (field.name(), Vector::new_dense(vector.clone()))
            }
            VectorQuery::Lexical(v) => {
                if v.indices.is_empty() {
                    return Ok(vec![]);
                }
                (LEXICAL_VECTOR, sparse(v)?)
            }
            VectorQuery::Late(question) => {
                let Some((query, mean)) = self.late_query(question)? else {
                    return Ok(vec![]);
                };
                scale = mean;
                shard = self.token_shard();
                (LATE_VECTOR, query)
            }
        };
        let query = QueryEnum::Nearest(NamedQuery::new(VectorInternal::from(vector), name));
        let req = SearchRequest {
            query: query.clone(),
            filter: Some(scope_filter(tenant, scope)),
            params: None,
            limit,
            offset: 0,
            with_payload: Some(WithPayloadInterface::Bool(false)),
            with_vector: None,
            score_threshold: None,
        };
        // As of an earlier time, the versions current then that edits have since replaced.
        let history = scope.as_of.map(|at| SearchRequest {
            query,
            filter: Some(history_filter(tenant, scope, at)),
            params: None,
            limit,
            offset: 0,
            with_payload: Some(WithPayloadInterface::Fields(vec![json_path("memory_id")])),
            with_vector: None,
            score_threshold: None,
        });
        // Each ask is its own blocking call: a second one is rare (a tie across the limit).
        super::search_settling_ties(limit, |asked| {
            let (mut req, history) = (req.clone(), history.clone());
            Self::blocking(shard, move |s| {
                req.limit = asked;
                let pts = s.search(req).map_err(err)?;
                let current = pts.iter().map(|p| (memory_id(&p.id), p.score * scale));
                let mut searches: Vec<super::EngineHits> = vec![current.collect()];
                if let Some(mut req) = history {
                    req.limit = asked;
                    let pts = s.search(req).map_err(err)?;
                    let replaced = pts.iter().map(|p| {
                        let m = payload_text(p, "memory_id").and_then(MemoryId::parse);
                        (m, p.score * scale)
                    });
                    searches.push(replaced.collect());
                }
                Ok(searches)
            })
        })
        .await
    }

    async fn field_vectors(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        let pids: Vec<PointId> = ids.iter().map(|m| point_id(*m)).collect();
        self.dense_vectors(pids, tenant.as_str().to_string()).await
    }

    async fn late_scores(
        &self,
        tenant: &TenantId,
        question: &TokenVectors,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let Some((query, scale)) = self.late_query(question)? else {
            return Ok(HashMap::new());
        };
        // The engine scores just the named points (a filter of a few ids is a plain scan).
        let req = SearchRequest {
            query: QueryEnum::Nearest(NamedQuery::new(query.0, LATE_VECTOR)),
            filter: Some(Filter {
                must: Some(vec![
                    match_value("tenant", tenant.as_str()),
                    Condition::HasId(ids.iter().map(|m| point_id(*m)).collect::<HasIdCondition>()),
                ]),
                ..Default::default()
            }),
            params: None,
            limit: ids.len(),
            offset: 0,
            with_payload: Some(WithPayloadInterface::Bool(false)),
            with_vector: None,
            score_threshold: None,
        };
        Self::blocking(self.token_shard(), move |s| {
            Ok(s.search(req)
                .map_err(err)?
                .iter()
                .filter_map(|p| memory_id(&p.id).map(|m| (m, p.score * scale)))
                .collect())
        })
        .await
    }

    async fn sentence_scores(
        &self,
        tenant: &TenantId,
        question: &TokenVectors,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        if ids.is_empty() || question.is_empty() || self.late_dim.is_none() {
            return Ok(HashMap::new());
        }
        let pids: Vec<PointId> = ids.iter().map(|m| point_id(*m)).collect();
        let owner = tenant.as_str().to_string();
        let question = question.clone();
        Self::blocking(self.token_shard(), move |s| {
            let recs = s
                .retrieve(
                    &pids,
                    Some(WithPayloadInterface::Fields(vec![
                        json_path("tenant"),
                        json_path(LATE_SEGMENTS),
                    ])),
                    Some(WithVector::Selector(vec![LATE_VECTOR.into()])),
                )
                .map_err(err)?;
            let mut out = HashMap::with_capacity(recs.len());
            for r in recs {
                let payload = r.payload.as_ref().map(|p| &p.0);
                if payload
                    .and_then(|p| p.get("tenant"))
                    .and_then(|v| v.as_str())
                    != Some(owner.as_str())
                {
                    continue;
                }
                let Some(segments) = payload.and_then(|p| segment_labels(p.get(LATE_SEGMENTS)))
                else {
                    continue;
                };
                let (Some(id), Some(VectorStructInternal::Named(mut named))) =
                    (memory_id(&r.id), r.vector)
                else {
                    continue;
                };
                let Some(VectorInternal::MultiDense(m)) = named.remove(LATE_VECTOR) else {
                    continue;
                };
                let rows = TokenVectors::new(m.dim, m.flattened_vectors)
                    .and_then(|t| t.with_segments(segments));
                if let Some(score) = rows.ok().and_then(|t| t.sentence_max_sim(&question)) {
                    out.insert(id, score);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn keep_versions(
        &self,
        tenant: &TenantId,
        versions: &[ReplacedVersion],
    ) -> Result<(), StoreError> {
        if versions.is_empty() {
            return Ok(());
        }
        let pids: Vec<PointId> = versions.iter().map(|v| point_id(v.memory_id)).collect();
        let n = versions.len();
        // The token vectors' shard first, as an upsert writes them.
        for shard in self.turn_shards().into_iter().rev() {
            let (pids, tenant, versions) = (pids.clone(), tenant.clone(), versions.to_vec());
            self.write(&shard, move |s| {
                Self::keep_versions_in(s, &pids, &tenant, &versions)
            })
            .await?;
        }
        self.optimizer.wrote(n);
        Ok(())
    }

    async fn version_vectors(
        &self,
        tenant: &TenantId,
        versions: &[(MemoryId, DateTime<Utc>)],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        let by_point: HashMap<MemoryId, MemoryId> = versions
            .iter()
            .map(|(m, at)| (version_point_id(*m, *at), *m))
            .collect();
        let pids: Vec<PointId> = by_point.keys().map(|m| point_id(*m)).collect();
        Ok(self
            .dense_vectors(pids, history_tenant(tenant))
            .await?
            .into_iter()
            .filter_map(|(p, v)| by_point.get(&p).map(|m| (*m, v)))
            .collect())
    }

    /// One update and one flush for a writer's whole batch, and only the forms the tenant did
    /// not have yet: most of a batch's keywords recur (from earlier turns, or other
    /// conversations), and rewriting such a point (same vector) copies it out of its optimised
    /// segment, leaving a deleted point there for the optimiser to clean up. Then one commit
    /// of which conversations say them.
    async fn upsert_keyword_sets(&self, sets: Vec<KeywordSet>) -> Result<(), StoreError> {
        let mut structs: HashMap<[u8; 16], PointStruct> = HashMap::new();
        let mut said: HashMap<String, Vec<Said>> = HashMap::new();
        for set in &sets {
            for k in &set.keywords {
                self.check_dim(&k.vector)?;
            }
        }
        // A form's id hashes its whole vector (1.5 KB, byte by byte). Conversations of a
        // batch share their keywords' vectors (one `Arc` from the embedder's cache), so each
        // (tenant, form, vector) is hashed once: while `sets` lives, one address is one vector.
        let mut ids: HashMap<(&str, &str, usize), [u8; 16]> = HashMap::new();
        for set in &sets {
            let tenant_said = said.entry(set.tenant.0.clone()).or_default();
            for k in &set.keywords {
                let point = *ids
                    .entry((set.tenant.as_str(), &k.keyword, k.vector.as_ptr() as usize))
                    .or_insert_with(|| keyword_form_point(&set.tenant, &k.keyword, &k.vector));
                tenant_said.push(Said {
                    conversation: set.conversation.clone(),
                    stem: k.keyword.clone(),
                    point,
                });
                structs.entry(point).or_insert_with(|| {
                    keyword_form_struct(&set.tenant, &k.keyword, point, k.vector.to_vec())
                });
            }
        }
        drop(ids);
        if structs.is_empty() {
            return Ok(());
        }
        let _changes = self.keyword_changes.lock().await;
        let unflushed = self.unflushed.clone();
        let n = self
            .write(&self.keywords, move |s| {
                let ids: Vec<PointId> = structs.keys().map(|p| form_id(*p)).collect();
                let known: std::collections::HashSet<PointId> = s
                    .retrieve(
                        &ids,
                        Some(WithPayloadInterface::Bool(false)),
                        Some(WithVector::Bool(false)),
                    )
                    .map_err(err)?
                    .into_iter()
                    .map(|r| r.id)
                    .collect();
                let new: Vec<qdrant_edge::PointStructPersisted> = structs
                    .into_iter()
                    .filter(|(p, _)| !known.contains(&form_id(*p)))
                    .map(|(_, p)| p.into())
                    .collect();
                let n = new.len();
                if n > 0 {
                    Self::upsert_in(s, new, unflushed.as_ref().map(|u| &u.keywords))?;
                }
                Ok(n)
            })
            .await?;
        // Who says a form is written after the form: a crash between the two leaves a form
        // nobody says yet, which the writer's replay of the batch then says again.
        let forms = self.forms.clone();
        let touched: Vec<(String, String)> = said
            .iter()
            .flat_map(|(t, s)| s.iter().map(move |s| (t.clone(), s.conversation.clone())))
            .collect();
        tokio::task::spawn_blocking(move || forms.add_by_tenant(&said)).await??;
        for (t, c) in touched {
            self.form_vectors.forget(&t, &c);
        }
        if n > 0 {
            self.optimizer.wrote(n);
        }
        Ok(())
    }

    async fn search_keywords(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        vector: &[f32],
        limit: usize,
        min_score: f32,
    ) -> Result<Vec<(String, f32)>, StoreError> {
        self.check_dim(vector)?;
        // A conversation's forms are scanned exactly (as the engine scanned them through its
        // payload index when points were per conversation); the tenant's through its graph.
        if scope.conversations.is_some() {
            let vectors = [vector.to_vec()];
            let mut out = self
                .search_keywords_many(tenant, scope, &vectors, limit, min_score)
                .await?;
            return Ok(out.pop().unwrap_or_default());
        }
        let req = SearchRequest {
            query: QueryEnum::Nearest(NamedQuery::new(
                VectorInternal::from(Vector::new_dense(vector.to_vec())),
                KEYWORD_VECTOR,
            )),
            filter: Some(filter_on(tenant.as_str(), &Scope::all())),
            params: None,
            limit,
            offset: 0,
            with_payload: Some(WithPayloadInterface::Fields(vec![json_path("keyword")])),
            with_vector: None,
            score_threshold: Some(min_score),
        };
        // A stem may have several forms: one blocking call per ask.
        super::search_keyword_names(limit, |asked| {
            let mut req = req.clone();
            Self::blocking(&self.keywords, move |s| {
                req.limit = asked;
                let pts = s.search(req).map_err(err)?;
                Ok(pts
                    .into_iter()
                    .map(|p| (payload_text(&p, "keyword").map(str::to_string), p.score))
                    .collect())
            })
        })
        .await
    }

    /// One pass over the scope's forms for all the vectors: a conversation's forms are a few
    /// MB of floats, read once rather than once per keyword of the question. A scope of the
    /// whole tenant goes through the engine's search, a vector at a time.
    async fn search_keywords_many(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        vectors: &[Vec<f32>],
        limit: usize,
        min_score: f32,
    ) -> Result<Vec<Vec<(String, f32)>>, StoreError> {
        let Some(conversations) = &scope.conversations else {
            let mut out = Vec::with_capacity(vectors.len());
            for v in vectors {
                out.push(
                    self.search_keywords(tenant, scope, v, limit, min_score)
                        .await?,
                );
            }
            return Ok(out);
        };
        for v in vectors {
            self.check_dim(v)?;
        }
        let queries: Vec<Vec<f32>> = vectors.iter().map(|v| unit(v.clone())).collect();
        let mut best: Vec<HashMap<String, f32>> = vec![HashMap::new(); queries.len()];
        for c in conversations {
            for (stem, v) in self.conversation_forms(tenant, c).await?.iter() {
                for (q, best) in queries.iter().zip(best.iter_mut()) {
                    let score = recollect_model::dot_lanes(q, v);
                    if score >= min_score {
                        let b = best.entry(stem.clone()).or_insert(score);
                        *b = b.max(score);
                    }
                }
            }
        }
        Ok(best
            .into_iter()
            .map(|best| {
                let mut out: Vec<(String, f32)> = best.into_iter().collect();
                out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                out.truncate(limit);
                out
            })
            .collect())
    }

    async fn delete_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        ids: &[MemoryId],
        keywords: &[String],
    ) -> Result<(), StoreError> {
        let turn_ids: Vec<PointId> = ids.iter().map(|m| point_id(*m)).collect();
        if !ids.is_empty() {
            let kept = Filter {
                must: Some(vec![
                    match_value("tenant", &history_tenant(tenant)),
                    match_any(
                        "memory_id",
                        &ids.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
                    ),
                ]),
                ..Default::default()
            };
            self.delete_in_turn_shards(vec![PointOperations::DeletePointsByFilter(kept)])
                .await?;
        }
        if !turn_ids.is_empty() {
            self.delete_in_turn_shards(vec![PointOperations::DeletePoints { ids: turn_ids }])
                .await?;
        }
        if !keywords.is_empty() {
            self.unsay(tenant, conversation, Some(keywords.to_vec()))
                .await?;
        }
        Ok(())
    }

    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError> {
        let scope = Scope::of(&[conversation]);
        let n = self.count(tenant, &scope).await?;
        let filter = scope_filter(tenant, &scope);
        let kept = filter_on(&history_tenant(tenant), &scope);
        self.delete_in_turn_shards(vec![
            PointOperations::DeletePointsByFilter(filter),
            PointOperations::DeletePointsByFilter(kept),
        ])
        .await?;
        self.unsay(tenant, conversation, None).await?;
        Ok(n)
    }

    async fn count(&self, tenant: &TenantId, scope: &Scope) -> Result<u64, StoreError> {
        let filter = scope_filter(tenant, scope);
        Self::blocking(&self.turns, move |s| {
            let n = s
                .count(CountRequest {
                    filter: Some(filter),
                    exact: true,
                })
                .map_err(err)?;
            Ok(n as u64)
        })
        .await
    }

    async fn copy_files_to(&self, to: &Path) -> Result<bool, StoreError> {
        let (writes, files) = (self.writes.clone(), self.files.clone());
        let shards = self.shards();
        let (from, to) = (self.dir.clone(), to.to_path_buf());
        // No change of keyword forms either: `keyword_forms.redb` is copied with the shards.
        let _changes = self.keyword_changes.lock().await;
        tokio::task::spawn_blocking(move || {
            // No update and no optimisation while the segments are copied.
            let _no_writes = writes.lock();
            let _no_rewrites = files.lock();
            for shard in &shards {
                shard.flush();
            }
            // The engine never reads its log's closed segments, and opening the copy would
            // remove them: not copied.
            let mut stale = std::collections::HashSet::new();
            for shard in ["turns", "keywords", "tokens"] {
                stale.extend(
                    stale_log_segments(&from.join(shard))?
                        .into_iter()
                        .map(|(p, _)| p),
                );
            }
            crate::copy_dir_except(&from, &to, &stale)?;
            Ok(true)
        })
        .await?
    }

    async fn sync(&self) -> Result<(), StoreError> {
        let Some(unflushed) = self.unflushed.clone() else {
            return Ok(());
        };
        let (writes, turns, keywords, tokens) = (
            self.writes.clone(),
            self.turns.clone(),
            self.keywords.clone(),
            self.tokens.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let _one_writer = writes.lock();
            let shards = [
                (&unflushed.tokens, tokens.as_ref()),
                (&unflushed.turns, Some(&turns)),
                (&unflushed.keywords, Some(&keywords)),
            ];
            for (flag, shard) in shards {
                let Some(shard) = shard else { continue };
                if flag.swap(false, Ordering::AcqRel) {
                    if let Err(e) = Self::flush(shard) {
                        flag.store(true, Ordering::Release);
                        return Err(e);
                    }
                }
            }
            Ok(())
        })
        .await?
    }

    /// Waits out a background optimisation in progress, then optimises what is left, so
    /// the caller meets a settled index (the bench times recall on one).
    async fn optimize(&self) -> Result<(), StoreError> {
        let (files, shards) = (self.files.clone(), self.shards());
        tokio::task::spawn_blocking(move || {
            let _no_rewrites = files.lock();
            for shard in shards {
                shard.optimize().map_err(err)?;
            }
            Ok(())
        })
        .await?
    }
}

impl EdgeVectorIndex {
    /// Whether the (turn, keyword) shards hold writes not yet flushed.
    #[cfg(test)]
    pub(crate) fn unflushed_shards(&self) -> (bool, bool) {
        self.unflushed.as_ref().map_or((false, false), |u| {
            (
                u.turns.load(Ordering::Acquire),
                u.keywords.load(Ordering::Acquire),
            )
        })
    }

    /// (turn points, keyword points) in scope, without an async runtime: erasure audits and tests.
    pub fn audit_counts(&self, tenant: &TenantId, scope: &Scope) -> Result<(u64, u64), StoreError> {
        // Kept versions count as turn points: they hold the turn's words too.
        let count = |shard: &EdgeShard| {
            Ok::<u64, StoreError>(
                shard_count(shard, scope_filter(tenant, scope))?
                    + shard_count(shard, filter_on(&history_tenant(tenant), scope))?,
            )
        };
        // A turn's token vectors are a point of it too: the larger count, so one left behind
        // in either shard shows.
        let mut turns = count(&self.turns)?;
        if let Some(tokens) = &self.tokens {
            turns = turns.max(count(tokens)?);
        }
        Ok((turns, self.keyword_points(tenant, scope)?))
    }

    /// Keyword forms in scope (erasure checks): those the scope's conversations say, or all
    /// the tenant's forms.
    pub async fn keyword_count(&self, tenant: &TenantId, scope: &Scope) -> Result<u64, StoreError> {
        // A short read, for audits and tests: not worth a blocking task.
        self.keyword_points(tenant, scope)
    }

    fn keyword_points(&self, tenant: &TenantId, scope: &Scope) -> Result<u64, StoreError> {
        match &scope.conversations {
            Some(conversations) => self.forms.count(tenant.as_str(), conversations),
            None => shard_count(&self.keywords, filter_on(tenant.as_str(), &Scope::all())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn_with_tokens(t: &TenantId, conversation: &str, i: usize) -> TurnPoint {
        let rows: Vec<f32> = (0..3 * 8)
            .map(|j| (((j * 7 + i * 13) % 11) as f32) - 5.0)
            .collect();
        let user = unit(vec![1.0, i as f32, 0.5, 0.0]);
        TurnPoint {
            late: Some(TokenVectors::new(8, rows).unwrap()),
            ..crate::contract::bare_point(t, conversation, i, user, SparseVector::default())
        }
    }

    /// A new store keeps token vectors in a shard of their own: its turn points hold none, and
    /// an erasure reaches the shard, with late interaction on or off when it comes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn token_vectors_live_in_their_own_shard_and_go_with_their_turns() {
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId("t".into());
        let pts: Vec<TurnPoint> = (0..4).map(|i| turn_with_tokens(&t, "c", i)).collect();
        let ids: Vec<MemoryId> = pts.iter().map(|p| p.memory_id).collect();
        let question = pts[1].late.clone().unwrap();
        {
            let idx =
                EdgeVectorIndex::open_shaped(dir.path(), 4, Some(8), Flushes::EachWrite).unwrap();
            idx.upsert_turns(pts.clone()).await.unwrap();
            idx.upsert_turns(vec![turn_with_tokens(&t, "d", 9)])
                .await
                .unwrap();
            assert_eq!(stored_late_dim(&dir.path().join("turns")).unwrap(), None);
            assert_eq!(
                stored_late_dim(&dir.path().join("tokens")).unwrap(),
                Some(8)
            );
            let scores = idx.late_scores(&t, &question, &ids).await.unwrap();
            assert_eq!(scores.len(), 4, "{scores:?}");
            assert!((scores[&ids[1]] - 1.0).abs() < 1e-2, "{scores:?}");
            // A later version without token vectors takes the earlier one's away.
            let mut plain = turn_with_tokens(&t, "c", 2);
            plain.late = None;
            idx.upsert_turns(vec![plain]).await.unwrap();
            let scores = idx.late_scores(&t, &question, &ids).await.unwrap();
            assert_eq!(scores.len(), 3, "{scores:?}");
            assert!(!scores.contains_key(&ids[2]), "{scores:?}");
            idx.optimize().await.unwrap();
            assert_eq!(idx.audit_counts(&t, &Scope::of(&["c"])).unwrap().0, 4);
            let tokens = idx.tokens.clone().unwrap();
            assert_eq!(
                shard_count(&tokens, scope_filter(&t, &Scope::of(&["c"]))).unwrap(),
                3
            );
        }
        // Late interaction off now: the shard is still opened, and erasures reach it.
        let idx =
            EdgeVectorIndex::open_shaped(dir.path(), 4, TokenVectorsWanted::No, Flushes::EachWrite)
                .unwrap();
        assert_eq!(idx.holds_token_vectors(), Some(false));
        let tokens = idx.tokens.clone().expect("the shard is open");
        idx.delete_conversation(&t, "c").await.unwrap();
        assert_eq!(idx.audit_counts(&t, &Scope::of(&["c"])).unwrap().0, 0);
        assert_eq!(
            shard_count(&tokens, scope_filter(&t, &Scope::of(&["c"]))).unwrap(),
            0
        );
        assert_eq!(
            shard_count(&tokens, scope_filter(&t, &Scope::of(&["d"]))).unwrap(),
            1
        );
    }

    /// The token shard is written once: holding more token vectors than the engine's indexing
    /// threshold (10,000 KB), an optimisation leaves its segment as it is. An erasure's token
    /// vectors leave the disk: past the engine's vacuum thresholds (a fifth of a segment's
    /// points, at least 1,000) the optimiser rewrites the segment without them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_token_shard_is_rewritten_only_to_vacuum_erased_turns() {
        const ROWS: usize = 40;
        const WIDTH: usize = 64;
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId("t".into());
        let idx =
            EdgeVectorIndex::open_shaped(dir.path(), 4, Some(WIDTH), Flushes::EachWrite).unwrap();
        let point = |c: &str, i: usize| {
            let rows = (0..ROWS * WIDTH)
                .map(|j| (((j * 7 + i * 13) % 11) as f32) - 5.0)
                .collect();
            let user = unit(vec![1.0, i as f32, 0.5, 0.0]);
            TurnPoint {
                late: Some(TokenVectors::new(WIDTH, rows).unwrap()),
                ..crate::contract::bare_point(&t, c, i, user, SparseVector::default())
            }
        };
        for (c, n) in [("gone", 1800), ("kept", 700)] {
            for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
                let pts = chunk.iter().map(|&i| point(c, i)).collect();
                idx.upsert_turns(pts).await.unwrap();
            }
        }
        // 2,500 turns of 40 half-precision rows of 64: 12.8 MB.
        let segments = || -> Vec<std::ffi::OsString> {
            let mut s: Vec<_> = std::fs::read_dir(dir.path().join("tokens").join("segments"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            s.sort();
            s
        };
        let tokens = idx.tokens.clone().unwrap();
        let written = segments();
        idx.optimize().await.unwrap();
        assert_eq!(segments(), written, "no rewrite of the token shard");
        assert_eq!(tokens.info().points_count, 2500);
        idx.delete_conversation(&t, "gone").await.unwrap();
        idx.optimize().await.unwrap();
        assert_ne!(segments(), written, "the vacuum rewrote the segment");
        assert_eq!(tokens.info().points_count, 700);
        let scope = Scope::of(&["kept"]);
        assert_eq!(shard_count(&tokens, scope_filter(&t, &scope)).unwrap(), 700);
        // The kept turns' token vectors still read whole after the rewrite.
        let question = point("kept", 3).late.unwrap();
        let found = idx
            .search(&t, &scope, &VectorQuery::Late(question), 1)
            .await
            .unwrap();
        assert!((found[0].1 - 1.0).abs() < 1e-2, "{found:?}");
    }

    /// A store made before the token shard keeps its token vectors in the turn points, and
    /// reads and writes them there: the late contract passes on it and no shard is made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_with_token_vectors_in_its_turns_passes_the_late_contract() {
        let dir = tempfile::tempdir().unwrap();
        drop(open_shard(&dir.path().join("turns"), turns_config(32, Some(16)), true).unwrap());
        let v = Arc::new(
            EdgeVectorIndex::open_shaped(dir.path(), 32, Some(16), Flushes::EachWrite).unwrap(),
        );
        assert!(v.tokens.is_none());
        crate::contract::late_contract(v, 32, 16).await;
        assert!(!dir.path().join("tokens").exists());
        assert_eq!(
            stored_late_dim(&dir.path().join("turns")).unwrap(),
            Some(16)
        );
    }

    async fn names(idx: &EdgeVectorIndex, t: &TenantId, conversations: &[&str]) -> Vec<String> {
        let mut n: Vec<String> = idx
            .search_keywords(
                t,
                &Scope::of(conversations),
                &[1.0, 0.1, 0.0, 0.0],
                10,
                -1.0,
            )
            .await
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        n.sort();
        n
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keyword_points_of_an_older_store_become_forms_said_by_their_conversations() {
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId("t".into());
        let vector = |y: f32| vec![1.0, y, 0.0, 0.0];
        {
            let idx = EdgeVectorIndex::open(dir.path(), 4).unwrap();
            // As stores before keyword forms wrote them: a point per conversation and keyword.
            let old = |conversation: &str, keyword: &str, v: Vec<f32>| {
                let id = MemoryId::derive(&t, conversation, &format!("keyword:{keyword}"));
                PointStruct::new(
                    point_id(id),
                    Vectors::new_named([(KEYWORD_VECTOR, Vector::new_dense(v))]),
                    serde_json::json!({"tenant": "t", "conversation": conversation, "keyword": keyword}),
                )
                .into()
            };
            let points: Vec<qdrant_edge::PointStructPersisted> = vec![
                old("a", "swim", vector(0.1)),
                old("b", "swim", vector(0.1)),
                old("b", "tent", vector(-0.9)),
            ];
            idx.keywords
                .update(UpdateOperation::PointOperation(
                    PointOperations::UpsertPoints(PointInsertOperations::PointsList(points)),
                ))
                .unwrap();
            EdgeVectorIndex::flush(&idx.keywords).unwrap();
        }
        let idx = EdgeVectorIndex::open(dir.path(), 4).unwrap();
        assert_eq!(names(&idx, &t, &["a"]).await, ["swim"]);
        assert_eq!(names(&idx, &t, &["b"]).await, ["swim", "tent"]);
        // One point per form: "swim" once for both conversations.
        assert_eq!(idx.keyword_count(&t, &Scope::all()).await.unwrap(), 2);
        assert_eq!(idx.keyword_count(&t, &Scope::of(&["b"])).await.unwrap(), 2);
        // Erasing b keeps the form a still says, and takes the one only b said.
        idx.delete_conversation(&t, "b").await.unwrap();
        assert_eq!(idx.keyword_count(&t, &Scope::all()).await.unwrap(), 1);
        assert_eq!(names(&idx, &t, &["a"]).await, ["swim"]);
        assert!(names(&idx, &t, &["b"]).await.is_empty());
        // Opening again finds nothing left to move.
        drop(idx);
        let idx = EdgeVectorIndex::open(dir.path(), 4).unwrap();
        assert_eq!(idx.keyword_count(&t, &Scope::all()).await.unwrap(), 1);
    }

    /// A shard whose log closes a segment every `kib` KiB, so a test fills several.
    fn small_log_config(kib: usize) -> qdrant_edge::EdgeConfig {
        EdgeConfigBuilder::new()
            .vector(
                KEYWORD_VECTOR,
                EdgeVectorParamsBuilder::new(4, Distance::Cosine).build(),
            )
            .wal_options(qdrant_edge::WalOptions {
                segment_capacity: kib * 1024,
                segment_queue_len: 0,
                retain_closed: std::num::NonZeroUsize::MIN,
            })
            .build()
    }

    fn upsert(shard: &EdgeShard, id: u64, tag: &str) {
        let vector = Vectors::new_named([(KEYWORD_VECTOR, Vector::new_dense(vec![1.0; 4]))]);
        let point = PointStruct::new(
            PointId::NumId(id),
            vector,
            serde_json::json!({ "tag": tag, "pad": "x".repeat(512) }),
        );
        EdgeVectorIndex::upsert_in(shard, vec![point.into()], None).unwrap();
    }

    /// Points written per round. The one written last holds the highest version, which a
    /// numbering restarted by a prune would fall below.
    const LAST: u64 = 399;

    /// Points 0..=LAST tagged `tag`: several of the test's log segments.
    fn write_all(shard: &EdgeShard, tag: &str) {
        for id in 0..=LAST {
            upsert(shard, id, tag);
        }
    }

    fn points(shard: &EdgeShard) -> u64 {
        let n = shard
            .count(CountRequest {
                filter: None,
                exact: true,
            })
            .unwrap();
        n as u64
    }

    fn tag(shard: &EdgeShard, id: u64) -> Option<String> {
        let recs = shard
            .retrieve(
                &[PointId::NumId(id)],
                Some(WithPayloadInterface::Bool(true)),
                Some(WithVector::Bool(false)),
            )
            .unwrap();
        let payload = serde_json::to_value(&recs.first()?.payload).unwrap();
        payload["tag"].as_str().map(str::to_string)
    }

    fn closed_segments(dir: &Path) -> usize {
        std::fs::read_dir(dir.join("wal"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("closed-")
            })
            .count()
    }

    /// A store written by a model of another width is refused by name and widths, and left as
    /// it was: the model that wrote it still opens it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_of_another_vector_width_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId("t".into());
        {
            let idx = EdgeVectorIndex::open(dir.path(), 4).unwrap();
            let set = KeywordSet {
                tenant: t.clone(),
                conversation: "a".into(),
                keywords: vec![recollect_model::KeywordVector {
                    keyword: "swim".into(),
                    vector: vec![1.0, 0.1, 0.0, 0.0].into(),
                }],
            };
            idx.upsert_keyword_sets(vec![set]).await.unwrap();
            idx.sync().await.unwrap();
        }
        let e = EdgeVectorIndex::open(dir.path(), 8).err().expect("refused");
        let message = e.to_string();
        assert!(matches!(e, StoreError::Invalid(_)), "{message}");
        assert!(
            message.contains("4-dimension") && message.contains("gives 8"),
            "{message}"
        );
        let idx = EdgeVectorIndex::open(dir.path(), 4).unwrap();
        assert_eq!(names(&idx, &t, &["a"]).await, ["swim"]);
    }

    /// Updates without the engine's log: nothing is logged, and what was written stays across
    /// opens, with or without the log's files, because updates are numbered past the segments'
    /// versions (an update numbered below a point's version would be ignored).
    #[test]
    fn updates_without_the_log_are_kept_and_later_updates_apply() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard");
        let shard = open_shard(&path, small_log_config(64), false).unwrap();
        write_all(&shard, "first");
        write_all(&shard, "second");
        assert_eq!(closed_segments(&path), 0, "nothing was logged");
        drop(shard);

        let shard = open_shard(&path, small_log_config(64), false).unwrap();
        assert_eq!(points(&shard), LAST + 1);
        assert_eq!(tag(&shard, LAST).as_deref(), Some("second"));
        upsert(&shard, LAST, "third");
        assert_eq!(tag(&shard, LAST).as_deref(), Some("third"));
        drop(shard);

        // The log's files gone altogether: the numbering still goes on from the segments.
        std::fs::remove_dir_all(path.join("wal")).unwrap();
        let shard = open_shard(&path, small_log_config(64), false).unwrap();
        assert_eq!(tag(&shard, LAST).as_deref(), Some("third"));
        upsert(&shard, LAST, "fourth");
        upsert(&shard, 0, "fourth");
        assert_eq!(tag(&shard, LAST).as_deref(), Some("fourth"));
        assert_eq!(tag(&shard, 0).as_deref(), Some("fourth"));
        drop(shard);
        let shard = open_shard(&path, small_log_config(64), false).unwrap();
        assert_eq!(tag(&shard, LAST).as_deref(), Some("fourth"));
        assert_eq!(points(&shard), LAST + 1);
    }

    /// A store written with the engine's log on (every store before the log was turned off)
    /// has its log pruned on open, and what was written stays: every point, and updates after
    /// the prune still apply (the operation numbers, the points' versions, keep growing).
    #[test]
    fn pruning_the_write_ahead_log_loses_nothing_and_later_updates_apply() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard");
        let logged = |config| {
            let shard = open_shard(&path, config, false).unwrap();
            shard.set_write_ahead_log(true);
            shard
        };
        write_all(&logged(small_log_config(64)), "first");
        let before = closed_segments(&path);
        assert!(before > 2, "the test fills several log segments: {before}");

        // A backup's copy leaves the stale segments out, and opens with every point.
        let stale: std::collections::HashSet<_> = stale_log_segments(&path)
            .unwrap()
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(stale.len(), before - 1);
        let copy = dir.path().join("copy");
        crate::copy_dir_except(&path, &copy, &stale).unwrap();
        assert_eq!(closed_segments(&copy), 1);
        let copied = open_shard(&copy, small_log_config(64), false).unwrap();
        assert_eq!(points(&copied), LAST + 1);
        drop(copied);

        let shard = open_shard(&path, small_log_config(64), false).unwrap();
        assert_eq!(closed_segments(&path), 1, "all but the newest removed");
        assert_eq!(points(&shard), LAST + 1);
        assert_eq!(tag(&shard, LAST).as_deref(), Some("first"));
        upsert(&shard, LAST, "second");
        assert_eq!(tag(&shard, LAST).as_deref(), Some("second"));
        drop(shard);

        // Once more, so the second prune runs on a log that was pruned before, and with
        // another segment size (a store written before `log_options`).
        let shard = logged(small_log_config(16));
        assert_eq!(tag(&shard, LAST).as_deref(), Some("second"));
        write_all(&shard, "third");
        assert_eq!(tag(&shard, LAST).as_deref(), Some("third"));
        drop(shard);
        let shard = open_shard(&path, small_log_config(16), false).unwrap();
        assert_eq!(closed_segments(&path), 1);
        upsert(&shard, LAST, "fourth");
        assert_eq!(tag(&shard, LAST).as_deref(), Some("fourth"));
    }
}
