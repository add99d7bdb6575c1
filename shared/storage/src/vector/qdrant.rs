//! `VectorIndex` on a Qdrant server through qdrant-client (gRPC), laid out as the embedded
//! engine is: a turns collection (named dense `user`/`assistant`, sparse `lexical` with the IDF
//! modifier; payload indexes on tenant as a tenant index, conversation, turn_id, position,
//! timestamp) and a keywords collection, both created idempotently with the configured dimension,
//! and with late interaction a tokens collection of the turns' token vectors that the server's
//! optimiser never rewrites ([`tokens_collection`]); collections made before it keep token
//! vectors in the turn points, and are read and written as they were.
//!
//! Every request is built by a plain function (unit-tested below without a server); the adapter
//! only sends them. Field max-sim is done in our code from the two field queries, as with the
//! embedded engine (the server's formula language has no max before 1.20).

use std::collections::HashMap;

use async_trait::async_trait;
use qdrant_client::config::QdrantConfig;
use qdrant_client::qdrant::r#match::MatchValue;
use qdrant_client::qdrant::{
    point_id::PointIdOptions, value::Kind, vectors_config, Condition, CountPointsBuilder,
    CreateCollection, CreateCollectionBuilder, CreateFieldIndexCollection,
    CreateFieldIndexCollectionBuilder, Datatype, DatetimeIndexParamsBuilder, DatetimeRange,
    DeletePointsBuilder, Distance, FieldType, Filter, Fusion, GetPointsBuilder,
    HnswConfigDiffBuilder, IntegerIndexParamsBuilder, KeywordIndexParamsBuilder, Modifier,
    MultiVectorComparator, MultiVectorConfigBuilder, OptimizersConfigDiffBuilder,
    PayloadIncludeSelector, PointId, PointStruct, PointsIdsList, PrefetchQueryBuilder, Query,
    QueryBatchPointsBuilder, QueryPoints, QueryPointsBuilder, Range, ScoredPoint,
    SparseVectorParamsBuilder, SparseVectorsConfigBuilder, Timestamp, Value as QValue, Vector,
    VectorInput, VectorParamsBuilder, VectorsConfigBuilder, VectorsSelector,
};
use qdrant_client::{Payload, Qdrant};
use recollect_model::{MemoryId, SparseVector, TenantId, TokenVectors};

use crate::vector::{
    history_tenant, version_point_id, FieldVectors, KeywordSet, ReplacedVersion,
    TokenVectorsWanted, TurnPoint, VectorField, VectorIndex, VectorQuery, ASSISTANT_VECTOR,
    KEYWORD_VECTOR, LATE_SEGMENTS, LATE_VECTOR, LEXICAL_VECTOR, USER_VECTOR,
};
use crate::{Scope, StoreError};

const ADAPTER: &str = "qdrant";
/// Points per upsert request (the server's default request limit is 32 MiB).
const UPSERT_BATCH: usize = 512;

/// How to reach the server (vectors.url, vectors.api_key).
#[derive(Clone)]
pub struct QdrantSettings {
    /// The gRPC address. `https://` turns TLS on; qdrant-client (1.20, its TLS is always built in)
    /// then checks the server's certificate against the platform's roots, read by
    /// rustls-native-certs, which takes SSL_CERT_FILE / SSL_CERT_DIR instead when set: the way
    /// to trust a private CA, since the client takes no CA file or client certificate itself.
    pub url: String,
    /// Sent as the `api-key` header on every request; empty sends none. Secret: redacted from
    /// `Debug`.
    pub api_key: String,
}

impl std::fmt::Debug for QdrantSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QdrantSettings")
            .field("url", &self.url)
            .field(
                "api_key",
                &if self.api_key.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .finish()
    }
}

/// The client configuration for `s`.
pub fn client_config(s: &QdrantSettings) -> QdrantConfig {
    let mut c = QdrantConfig::from_url(&s.url);
    if !s.api_key.is_empty() {
        c.set_api_key(&s.api_key);
    }
    c
}

pub struct QdrantVectorIndex {
    client: Qdrant,
    turns: String,
    keywords: String,
    /// The turns' token vectors, when they are not in the turn points: once it exists it is
    /// used whatever `embedder.late_model` says, so an erasure still reaches it.
    tokens: Option<String>,
    dim: usize,
    /// The width of the turns' token vectors, when the index holds them and late interaction
    /// is on.
    late_dim: Option<usize>,
}

fn err(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::backend("qdrant", e)
}

fn point_id(id: MemoryId) -> PointId {
    PointId::from(id.to_string())
}

fn memory_id(p: &Option<PointId>) -> Option<MemoryId> {
    match p.as_ref()?.point_id_options.as_ref()? {
        PointIdOptions::Uuid(u) => MemoryId::parse(u),
        PointIdOptions::Num(_) => None,
    }
}

/// A keyword form's point in a conversation: every form the conversation said is kept, as the
/// embedded index keeps them, so a question's "games" meets the "games" a turn said whichever
/// form came first. (Stores written before kept one point per keyword, the first form, under
/// `keyword:{keyword}`; those stay beside the new ones, and erasure matches both by payload.)
fn keyword_form_id(
    tenant: &TenantId,
    conversation: &str,
    keyword: &str,
    vector: &[f32],
) -> MemoryId {
    let h = super::form_hash(vector);
    MemoryId::derive(tenant, conversation, &format!("keyword:{keyword}:{h:016x}"))
}

fn text(payload: &HashMap<String, QValue>, key: &str) -> Option<String> {
    match payload.get(key)?.kind.as_ref()? {
        Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn ts(t: chrono::DateTime<chrono::Utc>) -> Timestamp {
    Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// Tenant always; conversations when the scope names them; the turn filter. As of an earlier
/// time: the current points recorded by then (points written before `recorded_at` was kept
/// count as recorded; recall checks each turn's record again).
pub fn scope_filter(tenant: &TenantId, scope: &Scope) -> Filter {
    let mut f = filter_on(tenant.as_str(), scope);
    if let Some(at) = scope.as_of {
        f.must.push(
            Filter::should([
                Condition::datetime_range(
                    "recorded_at",
                    DatetimeRange {
                        lte: Some(ts(at)),
                        ..Default::default()
                    },
                ),
                Condition::is_empty("recorded_at"),
            ])
            .into(),
        );
    }
    f
}

/// The kept versions in scope that were current at `at`.
fn history_filter(tenant: &TenantId, scope: &Scope, at: chrono::DateTime<chrono::Utc>) -> Filter {
    let mut f = filter_on(&history_tenant(tenant), scope);
    f.must.push(Condition::datetime_range(
        "recorded_at",
        DatetimeRange {
            lte: Some(ts(at)),
            ..Default::default()
        },
    ));
    f.must.push(Condition::datetime_range(
        "expired_at",
        DatetimeRange {
            gt: Some(ts(at)),
            ..Default::default()
        },
    ));
    f
}

/// [`scope_filter`]'s conditions under a tenant key (a tenant's, or its kept versions').
fn filter_on(tenant_key: &str, scope: &Scope) -> Filter {
    // An explicit keyword match: the client's From<String> turns text with spaces into a
    // full-text match, which is not what an id needs.
    let mut must = vec![Condition::matches(
        "tenant",
        MatchValue::Keyword(tenant_key.to_string()),
    )];
    if let Some(convs) = &scope.conversations {
        must.push(Condition::matches("conversation", convs.clone()));
    }
    let f = &scope.filter;
    for (key, values) in [
        ("user_id", &f.user_ids),
        ("agent_id", &f.agent_ids),
        ("speakers", &f.speakers),
    ] {
        if !values.is_empty() {
            must.push(Condition::matches(key, values.clone()));
        }
    }
    if f.from.is_some() || f.to.is_some() {
        must.push(Condition::datetime_range(
            "timestamp",
            DatetimeRange {
                gte: f.from.map(ts),
                lt: f.to.map(ts),
                ..Default::default()
            },
        ));
    }
    for (k, v) in &f.metadata {
        let key = format!("metadata.{k}");
        must.push(match v {
            serde_json::Value::String(s) => Condition::matches(key, MatchValue::Keyword(s.clone())),
            serde_json::Value::Bool(b) => Condition::matches(key, *b),
            // Numbers by value, integer or not (validated finite): a closed one-point range.
            v => {
                let x = v.as_f64().unwrap_or(f64::NAN);
                Condition::range(
                    key,
                    Range {
                        gte: Some(x),
                        lte: Some(x),
                        ..Default::default()
                    },
                )
            }
        });
    }
    Filter::must(must)
}

/// Dense field vectors of retrieved points whose tenant key is `owner`, by point id.
fn field_vectors_of(
    points: Vec<qdrant_client::qdrant::RetrievedPoint>,
    owner: &str,
) -> HashMap<MemoryId, FieldVectors> {
    let mut out = HashMap::with_capacity(points.len());
    for r in points {
        if text(&r.payload, "tenant").as_deref() != Some(owner) {
            continue;
        }
        let (Some(id), Some(v)) = (memory_id(&r.id), r.vectors.as_ref()) else {
            continue;
        };
        let dense = |name: &str| match v.get_vector_by_name(name)? {
            qdrant_client::qdrant::vector_output::Vector::Dense(d) => Some(d.data),
            _ => None,
        };
        let Some(user) = dense(USER_VECTOR) else {
            continue;
        };
        out.insert(
            id,
            FieldVectors {
                user,
                assistant: dense(ASSISTANT_VECTOR),
            },
        );
    }
    out
}

fn sparse_pairs(v: &SparseVector) -> (Vec<u32>, Vec<f32>) {
    let mut pairs: Vec<(u32, f32)> = v
        .indices
        .iter()
        .copied()
        .zip(v.values.iter().copied())
        .collect();
    pairs.sort_by_key(|p| p.0);
    pairs.dedup_by_key(|p| p.0);
    pairs.into_iter().unzip()
}

/// Every query is filtered by tenant: one HNSW graph per tenant (`payload_m` on the tenant
/// index) and no graph of all tenants (`m: 0`), Qdrant's own multitenancy setup and the
/// embedded engine's (`vector/edge.rs`, `graph_config`); building the global graph as well was
/// half of the index build.
fn per_tenant_graphs() -> HnswConfigDiffBuilder {
    HnswConfigDiffBuilder::default().m(0).payload_m(16)
}

/// Token vectors: a multivector compared by MaxSim, f16 on disk, in no graph (recall scores
/// only the turns it names, or a scope's), as the embedded engine keeps them.
fn token_vector_params(width: usize) -> VectorParamsBuilder {
    VectorParamsBuilder::new(width as u64, Distance::Cosine)
        .multivector_config(MultiVectorConfigBuilder::new(MultiVectorComparator::MaxSim))
        .datatype(Datatype::Float16)
        .on_disk(true)
        .hnsw_config(HnswConfigDiffBuilder::default().m(0).payload_m(0))
}

/// The turns collection: named dense `user` and `assistant`, sparse `lexical` scored with IDF;
/// with `late` also the token vectors, `late`, as collections made before
/// [`tokens_collection`] hold them.
pub fn turns_collection(name: &str, dim: usize, late: Option<usize>) -> CreateCollection {
    let mut dense = VectorsConfigBuilder::default();
    for field in [USER_VECTOR, ASSISTANT_VECTOR] {
        dense.add_named_vector_params(
            field,
            VectorParamsBuilder::new(dim as u64, Distance::Cosine),
        );
    }
    if let Some(late) = late {
        dense.add_named_vector_params(LATE_VECTOR, token_vector_params(late));
    }
    let mut sparse = SparseVectorsConfigBuilder::default();
    sparse.add_named_vector_params(
        LEXICAL_VECTOR,
        SparseVectorParamsBuilder::default().modifier(Modifier::Idf as i32),
    );
    CreateCollectionBuilder::new(name)
        .vectors_config(dense)
        .sparse_vectors_config(sparse)
        .hnsw_config(per_tenant_graphs())
        .build()
}

/// The turns' token vectors in a collection of their own, a point per turn under its id with its
/// payload (so scope filters read the same), never indexed (`indexing_threshold` 0). The
/// server's optimiser rebuilds a segment with every vector of its points: in the turns
/// collection it copied each turn's token rows (~28 KB of its ~29 KB) into every segment it
/// built for the dense vectors' graphs; here it only vacuums erased turns.
pub fn tokens_collection(name: &str, width: usize) -> CreateCollection {
    let mut vectors = VectorsConfigBuilder::default();
    vectors.add_named_vector_params(LATE_VECTOR, token_vector_params(width));
    CreateCollectionBuilder::new(name)
        .vectors_config(vectors)
        .optimizers_config(OptimizersConfigDiffBuilder::default().indexing_threshold(0))
        .build()
}

pub fn keywords_collection(name: &str, dim: usize) -> CreateCollection {
    let mut dense = VectorsConfigBuilder::default();
    dense.add_named_vector_params(
        KEYWORD_VECTOR,
        VectorParamsBuilder::new(dim as u64, Distance::Cosine),
    );
    CreateCollectionBuilder::new(name)
        .vectors_config(dense)
        .hnsw_config(per_tenant_graphs())
        .build()
}

/// Payload indexes: tenant as a tenant index (co-locates a tenant's points), the rest for
/// filters and ordering.
pub fn payload_indexes(collection: &str, turns: bool) -> Vec<CreateFieldIndexCollection> {
    let mut out = vec![
        CreateFieldIndexCollectionBuilder::new(collection, "tenant", FieldType::Keyword)
            .field_index_params(KeywordIndexParamsBuilder::default().is_tenant(true))
            .wait(true)
            .build(),
        CreateFieldIndexCollectionBuilder::new(collection, "conversation", FieldType::Keyword)
            .wait(true)
            .build(),
    ];
    if turns {
        for field in ["user_id", "agent_id"] {
            out.push(
                CreateFieldIndexCollectionBuilder::new(collection, field, FieldType::Keyword)
                    .wait(true)
                    .build(),
            );
        }
        out.push(
            CreateFieldIndexCollectionBuilder::new(collection, "turn_id", FieldType::Keyword)
                .wait(true)
                .build(),
        );
        out.push(
            CreateFieldIndexCollectionBuilder::new(collection, "position", FieldType::Integer)
                .field_index_params(IntegerIndexParamsBuilder::new(true, true))
                .wait(true)
                .build(),
        );
        out.push(
            CreateFieldIndexCollectionBuilder::new(collection, "timestamp", FieldType::Datetime)
                .field_index_params(DatetimeIndexParamsBuilder::default())
                .wait(true)
                .build(),
        );
    }
    out
}

fn opt_text(v: &Option<String>) -> QValue {
    match v {
        Some(s) => QValue::from(s.as_str()),
        None => QValue {
            kind: Some(Kind::NullValue(0)),
        },
    }
}

/// A payload's sentence labels (`LATE_SEGMENTS`), None when not a list of small integers.
fn segment_labels(v: &QValue) -> Option<Vec<recollect_model::Segment>> {
    let Some(Kind::ListValue(list)) = &v.kind else {
        return None;
    };
    list.values
        .iter()
        .map(|x| match x.kind {
            Some(Kind::IntegerValue(n)) => u16::try_from(n).ok().map(recollect_model::Segment),
            Some(Kind::DoubleValue(f)) if f.fract() == 0.0 && (0.0..65536.0).contains(&f) => {
                Some(recollect_model::Segment(f as u16))
            }
            _ => None,
        })
        .collect()
}

/// JSON metadata as a payload value (the client's serde conversion is behind a feature this
/// workspace leaves off).
fn json_value(v: &serde_json::Value) -> QValue {
    use qdrant_client::qdrant::{ListValue, Struct};
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Kind::IntegerValue(i),
            None => Kind::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_value).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(Struct {
            fields: o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect(),
        }),
    };
    QValue { kind: Some(kind) }
}

/// A turn's point: its vectors by name and the payload filters and indexes use; its token
/// vectors when the collection holds them (`late`).
pub fn turn_point(p: &TurnPoint, late: bool) -> PointStruct {
    let mut vectors: HashMap<String, Vector> = HashMap::new();
    if let Some(t) = p.late.as_ref().filter(|_| late) {
        vectors.insert(LATE_VECTOR.into(), token_rows(t));
    }
    vectors.insert(USER_VECTOR.into(), Vector::new_dense(p.user.clone()));
    if let Some(a) = &p.assistant {
        vectors.insert(ASSISTANT_VECTOR.into(), Vector::new_dense(a.clone()));
    }
    if !p.lexical.indices.is_empty() {
        let (i, v) = sparse_pairs(&p.lexical);
        vectors.insert(LEXICAL_VECTOR.into(), Vector::new_sparse(i, v));
    }
    PointStruct::new(point_id(p.memory_id), vectors, turn_payload(p, late))
}

/// A turn's token vectors as a point of the tokens collection ([`tokens_collection`]); None
/// when it has none.
pub fn token_point(p: &TurnPoint) -> Option<PointStruct> {
    let t = p.late.as_ref()?;
    let vectors = HashMap::from([(LATE_VECTOR.to_string(), token_rows(t))]);
    Some(PointStruct::new(
        point_id(p.memory_id),
        vectors,
        turn_payload(p, true),
    ))
}

fn token_rows(t: &TokenVectors) -> Vector {
    Vector::new_multi(t.rows().map(<[f32]>::to_vec).collect::<Vec<_>>())
}

/// The payload a turn's points carry; with `late`, its token rows' sentence labels.
fn turn_payload(p: &TurnPoint, late: bool) -> Payload {
    let mut payload = Payload::new();
    payload.insert("tenant", p.tenant.as_str());
    payload.insert("conversation", p.conversation_id.as_str());
    payload.insert("turn_id", p.turn_id.as_str());
    payload.insert("position", i64::try_from(p.position).unwrap_or(i64::MAX));
    payload.insert("timestamp", p.timestamp.to_rfc3339());
    payload.insert("user_speaker", opt_text(&p.user_speaker));
    payload.insert("assistant_speaker", opt_text(&p.assistant_speaker));
    let mut speakers: Vec<&str> = p.user_speaker.iter().map(String::as_str).collect();
    if p.assistant.is_some() {
        speakers.extend(p.assistant_speaker.as_deref());
    }
    payload.insert("speakers", speakers);
    payload.insert("recorded_at", p.recorded_at.to_rfc3339());
    // Filter fields only when the turn has them (most turns carry none).
    for (k, v) in [("user_id", &p.user_id), ("agent_id", &p.agent_id)] {
        if let Some(v) = v {
            payload.insert(k, v.as_str());
        }
    }
    if !p.metadata.is_empty() {
        payload.insert(
            "metadata",
            json_value(&serde_json::Value::Object(p.metadata.clone())),
        );
    }
    if let Some(t) = p.late.as_ref().filter(|t| late && !t.segments.is_empty()) {
        let labels: Vec<i64> = t.segments.iter().map(|s| i64::from(s.0)).collect();
        payload.insert(LATE_SEGMENTS, labels);
    }
    payload
}

/// One retriever: nearest by a named dense field or by the lexical sparse vector, in scope.
/// None when the query cannot match anything (an empty lexical vector).
pub fn search_request(
    collection: &str,
    tenant: &TenantId,
    scope: &Scope,
    query: &VectorQuery,
    limit: usize,
) -> Option<QueryPoints> {
    let (using, input) = match query {
        VectorQuery::Dense { field, vector } => {
            (field.name(), VectorInput::new_dense(vector.clone()))
        }
        VectorQuery::Lexical(v) => {
            if v.indices.is_empty() {
                return None;
            }
            let (i, vals) = sparse_pairs(v);
            (LEXICAL_VECTOR, VectorInput::new_sparse(i, vals))
        }
        VectorQuery::Late(question) => {
            if question.is_empty() {
                return None;
            }
            (LATE_VECTOR, late_input(question))
        }
    };
    Some(
        QueryPointsBuilder::new(collection)
            .query(Query::new_nearest(input))
            .using(using)
            .filter(scope_filter(tenant, scope))
            .limit(limit as u64)
            .with_payload(false)
            .build(),
    )
}

/// Hybrid retrieval on the server: one prefetch per vector (user, assistant, lexical), each with
/// the tenant/conversation filter, fused by reciprocal rank.
pub fn hybrid_request(
    collection: &str,
    tenant: &TenantId,
    scope: &Scope,
    dense: &[f32],
    lexical: &SparseVector,
    limit: usize,
) -> QueryPoints {
    let filter = scope_filter(tenant, scope);
    let mut prefetch = Vec::new();
    for field in [USER_VECTOR, ASSISTANT_VECTOR] {
        prefetch.push(
            PrefetchQueryBuilder::default()
                .query(Query::new_nearest(VectorInput::new_dense(dense.to_vec())))
                .using(field)
                .filter(filter.clone())
                .limit(limit as u64)
                .build(),
        );
    }
    if !lexical.indices.is_empty() {
        let (i, v) = sparse_pairs(lexical);
        prefetch.push(
            PrefetchQueryBuilder::default()
                .query(Query::new_nearest(VectorInput::new_sparse(i, v)))
                .using(LEXICAL_VECTOR)
                .filter(filter.clone())
                .limit(limit as u64)
                .build(),
        );
    }
    QueryPointsBuilder::new(collection)
        .prefetch(prefetch)
        .query(Query::new_fusion(Fusion::Rrf))
        .filter(filter)
        .limit(limit as u64)
        .with_payload(false)
        .build()
}

/// The question's token vectors as the server's multivector query on `late`.
fn late_input(question: &TokenVectors) -> VectorInput {
    VectorInput::new_multi(question.rows().map(<[f32]>::to_vec).collect::<Vec<_>>())
}

/// Late interaction on the server: the named turns of the tenant, scored by MaxSim of their
/// token vectors against the question's (a filter of a few ids is a plain scan there).
pub fn late_request(
    collection: &str,
    tenant: &TenantId,
    question: &TokenVectors,
    ids: &[MemoryId],
) -> QueryPoints {
    QueryPointsBuilder::new(collection)
        .query(Query::new_nearest(late_input(question)))
        .using(LATE_VECTOR)
        .filter(Filter::must([
            Condition::matches("tenant", MatchValue::Keyword(tenant.as_str().to_string())),
            Condition::has_id(ids.iter().map(|m| point_id(*m))),
        ]))
        .limit(ids.len() as u64)
        .with_payload(false)
        .build()
}

/// The best field score per turn (field max-sim), from the user and assistant answers.
pub fn field_max(answers: &[Vec<ScoredPoint>]) -> HashMap<MemoryId, f32> {
    let mut out: HashMap<MemoryId, f32> = HashMap::new();
    for p in answers.iter().flatten() {
        if let Some(id) = memory_id(&p.id) {
            let e = out.entry(id).or_insert(f32::MIN);
            *e = e.max(p.score);
        }
    }
    out
}

impl QdrantVectorIndex {
    /// Connects to `url` (gRPC, e.g. http://127.0.0.1:6334) and creates `{prefix}_turns` and
    /// `{prefix}_keywords` if missing (and, with token vectors, `{prefix}_tokens`).
    pub async fn connect(url: &str, prefix: &str, dim: usize) -> Result<Self, StoreError> {
        Self::connect_with(
            &QdrantSettings {
                url: url.into(),
                api_key: String::new(),
            },
            prefix,
            dim,
        )
        .await
    }

    /// As [`Self::connect`], with an API key and TLS (`https://`) as the settings say.
    pub async fn connect_with(
        settings: &QdrantSettings,
        prefix: &str,
        dim: usize,
    ) -> Result<Self, StoreError> {
        Self::connect_shaped(settings, prefix, dim, None).await
    }

    /// [`Self::connect_with`], the turns holding token vectors as `late` says
    /// (`embedder.late_model`): a collection made without them is refused when they are
    /// required, and used without them when they are wanted where possible.
    pub async fn connect_shaped(
        settings: &QdrantSettings,
        prefix: &str,
        dim: usize,
        late: impl Into<TokenVectorsWanted>,
    ) -> Result<Self, StoreError> {
        let late = late.into();
        let client = client_config(settings).build().map_err(err)?;
        let mut index = Self {
            client,
            turns: format!("{prefix}_turns"),
            keywords: format!("{prefix}_keywords"),
            tokens: None,
            dim,
            late_dim: late.width(),
        };
        index
            .ensure_collections(late, format!("{prefix}_tokens"))
            .await?;
        Ok(index)
    }

    /// The width of each named vector of the collection `name`, as the server reports it.
    async fn widths(&self, name: &str) -> Result<impl Fn(&str) -> Option<u64>, StoreError> {
        let info = self.client.collection_info(name).await.map_err(err)?;
        let config = info
            .result
            .and_then(|c| c.config)
            .and_then(|c| c.params)
            .and_then(|p| p.vectors_config)
            .and_then(|v| v.config);
        Ok(move |vector: &str| match &config {
            Some(vectors_config::Config::Params(p)) => Some(p.size),
            Some(vectors_config::Config::ParamsMap(m)) => m.map.get(vector).map(|p| p.size),
            None => None,
        })
    }

    async fn ensure_collections(
        &mut self,
        late: TokenVectorsWanted,
        tokens: String,
    ) -> Result<(), StoreError> {
        let (turns_held, tokens_held) = (self.held(&self.turns).await?, self.held(&tokens).await?);
        // A new index with token vectors keeps them in a collection of their own, made before
        // the turns': a start that stops between the two finds the same layout on the next.
        if tokens_held || (!turns_held && late.width().is_some()) {
            self.tokens = Some(tokens);
        }
        let keywords_held = self.held(&self.keywords).await?;
        // (name, held, how to make it when missing, whether it holds turns)
        let mut wanted: Vec<(String, bool, Option<CreateCollection>, bool)> = Vec::new();
        if let Some(name) = &self.tokens {
            // Held and late interaction off: opened for erasures, not made.
            let create = late.width().map(|width| tokens_collection(name, width));
            wanted.push((name.clone(), tokens_held, create, true));
        }
        wanted.push((
            self.turns.clone(),
            turns_held,
            Some(turns_collection(&self.turns, self.dim, None)),
            true,
        ));
        wanted.push((
            self.keywords.clone(),
            keywords_held,
            Some(keywords_collection(&self.keywords, self.dim)),
            false,
        ));
        for (name, held, create, turns) in wanted {
            if held {
                self.take_existing(&name, late).await?;
            } else if let Some(create) = create {
                // Two starting services may race here: "already exists" is success.
                if let Err(e) = self.client.create_collection(create).await {
                    if !e.to_string().contains("already exists") {
                        return Err(err(e));
                    }
                }
            }
            for idx in payload_indexes(&name, turns) {
                self.client.create_field_index(idx).await.map_err(err)?;
            }
        }
        Ok(())
    }

    async fn held(&self, collection: &str) -> Result<bool, StoreError> {
        self.client.collection_exists(collection).await.map_err(err)
    }

    /// What an operator deletes to start the index again.
    fn reset(&self) -> String {
        match &self.tokens {
            Some(tokens) => format!(
                "delete the collections {}, {} and {tokens}",
                self.turns, self.keywords
            ),
            None => format!(
                "delete the collections {} and {}",
                self.turns, self.keywords
            ),
        }
    }

    /// An existing collection, read once: one written with another model's width is refused at
    /// start, as the embedded index does (the server's own error would come only at the first
    /// write). Turns made without token vectors, and no tokens collection beside them, are
    /// refused when token vectors are required, since they cannot be added to the turns held,
    /// and used without them when they are wanted where possible.
    async fn take_existing(
        &mut self,
        name: &str,
        late: TokenVectorsWanted,
    ) -> Result<(), StoreError> {
        let size_of = self.widths(name).await?;
        let reset = self.reset();
        // Token vectors are in the tokens collection, or else in the turns'.
        let holds_late = match &self.tokens {
            Some(tokens) => name == tokens,
            None => name == self.turns,
        };
        if holds_late {
            match (late, size_of(LATE_VECTOR)) {
                (TokenVectorsWanted::No, _) => {}
                (TokenVectorsWanted::WherePossible(_), None) => {
                    tracing::info!(
                        collection = %name,
                        "this collection was made without token vectors: late interaction is off \
                         for it (delete the collections and run `recollect reindex` to turn it on)"
                    );
                    self.late_dim = None;
                }
                (TokenVectorsWanted::Required(_), None) => {
                    return Err(StoreError::Invalid(format!(
                        "the Qdrant collection {name} holds no token vectors and \
                         embedder.late_model gives them: {reset} and run `recollect reindex`, or \
                         turn embedder.late_model off"
                    )))
                }
                (
                    TokenVectorsWanted::Required(want) | TokenVectorsWanted::WherePossible(want),
                    Some(held),
                ) if held != want as u64 => {
                    return Err(super::another_width(
                        &format!("(Qdrant collection {name}, token vectors)"),
                        held,
                        want,
                        &reset,
                    ))
                }
                _ => {}
            }
        }
        let field = if name == self.turns {
            USER_VECTOR
        } else if name == self.keywords {
            KEYWORD_VECTOR
        } else {
            return Ok(()); // the tokens collection: no dense field
        };
        match size_of(field) {
            Some(held) if held != self.dim as u64 => Err(super::another_width(
                &format!("(Qdrant collection {name})"),
                held,
                self.dim,
                &reset,
            )),
            _ => Ok(()),
        }
    }

    /// The collection holding the turns' token vectors.
    fn late_collection(&self) -> &str {
        self.tokens.as_deref().unwrap_or(&self.turns)
    }

    /// The collections a turn has points in.
    fn turn_collections(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.turns.as_str()).chain(self.tokens.as_deref())
    }

    /// The token rows of `chunk` into the tokens collection, before their turns' points (a turn
    /// is never found without its rows); a version without them (or with late interaction off)
    /// removes the rows of the version before, as a turn point replaced whole did.
    async fn upsert_token_points(
        &self,
        tokens: &str,
        chunk: &[TurnPoint],
        late: bool,
    ) -> Result<(), StoreError> {
        let (mut rows, mut gone) = (Vec::new(), Vec::new());
        for p in chunk {
            match late.then(|| token_point(p)).flatten() {
                Some(point) => rows.push(point),
                None => gone.push(point_id(p.memory_id)),
            }
        }
        if !rows.is_empty() {
            self.client
                .upsert_points(
                    qdrant_client::qdrant::UpsertPointsBuilder::new(tokens, rows).wait(true),
                )
                .await
                .map_err(err)?;
        }
        if !gone.is_empty() {
            self.client
                .delete_points(
                    DeletePointsBuilder::new(tokens)
                        .points(PointsIdsList { ids: gone })
                        .wait(true),
                )
                .await
                .map_err(err)?;
        }
        Ok(())
    }

    /// [`VectorIndex::keep_versions`] in one of the collections a turn has points in: each
    /// point copied whole under the version's id.
    async fn keep_versions_in(
        &self,
        collection: &str,
        tenant: &TenantId,
        versions: &[ReplacedVersion],
    ) -> Result<(), StoreError> {
        let pids: Vec<PointId> = versions.iter().map(|v| point_id(v.memory_id)).collect();
        let res = self
            .client
            .get_points(
                GetPointsBuilder::new(collection, pids)
                    .with_payload(true)
                    .with_vectors(true),
            )
            .await
            .map_err(err)?;
        let mut keep = Vec::new();
        for r in res.result {
            let Some(id) = memory_id(&r.id) else { continue };
            let Some(v) = versions.iter().find(|v| v.memory_id == id) else {
                continue;
            };
            if text(&r.payload, "tenant").as_deref() != Some(tenant.as_str()) {
                continue;
            }
            // Still the version being replaced (a redelivered edit finds its own point).
            let recorded = text(&r.payload, "recorded_at")
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok());
            if recorded.is_some_and(|t| t != v.recorded_at) {
                continue;
            }
            let Some(vectors) = r.vectors.and_then(|v| v.vectors_options) else {
                continue;
            };
            let qdrant_client::qdrant::vectors_output::VectorsOptions::Vectors(named) = vectors
            else {
                continue;
            };
            let mut out: HashMap<String, Vector> = HashMap::new();
            for (name, vo) in named.vectors {
                use qdrant_client::qdrant::vector_output::Vector as V;
                match vo.into_vector() {
                    V::Dense(d) => out.insert(name, Vector::new_dense(d.data)),
                    V::Sparse(s) => out.insert(name, Vector::new_sparse(s.indices, s.values)),
                    V::MultiDense(m) => out.insert(
                        name,
                        Vector::new_multi(
                            m.vectors.into_iter().map(|d| d.data).collect::<Vec<_>>(),
                        ),
                    ),
                };
            }
            let mut payload = Payload::from(r.payload);
            payload.insert("tenant", history_tenant(tenant));
            payload.insert("memory_id", id.to_string());
            payload.insert("recorded_at", v.recorded_at.to_rfc3339());
            payload.insert("expired_at", v.expired_at.to_rfc3339());
            keep.push(PointStruct::new(
                point_id(version_point_id(id, v.recorded_at)),
                out,
                payload,
            ));
        }
        if keep.is_empty() {
            return Ok(());
        }
        self.client
            .upsert_points(
                qdrant_client::qdrant::UpsertPointsBuilder::new(collection, keep).wait(true),
            )
            .await
            .map_err(err)?;
        Ok(())
    }

    /// Dense field vectors of the given points whose tenant key is `owner`, by point id.
    async fn dense_vectors(
        &self,
        pids: Vec<PointId>,
        owner: &str,
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        let res = self
            .client
            .get_points(
                GetPointsBuilder::new(&self.turns, pids)
                    .with_payload(PayloadIncludeSelector::new(vec!["tenant".to_string()]))
                    .with_vectors(VectorsSelector::new(vec![
                        USER_VECTOR.to_string(),
                        ASSISTANT_VECTOR.to_string(),
                    ])),
            )
            .await
            .map_err(err)?;
        Ok(field_vectors_of(res.result, owner))
    }

    /// The factor that makes the server's MaxSim of `question` (summed over its tokens) a mean,
    /// once its width is checked against the collection's; None where the collection holds no
    /// token vectors.
    fn late_scale(&self, question: &TokenVectors) -> Result<Option<f32>, StoreError> {
        let Some(width) = self.late_dim else {
            return Ok(None);
        };
        if question.dim != width {
            return Err(StoreError::Invalid(format!(
                "token vectors of width {} for a collection of {width}",
                question.dim
            )));
        }
        Ok(Some(1.0 / question.len().max(1) as f32))
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

    /// Dense field max-sim: the user and assistant queries in one batch, the max per turn here.
    pub async fn field_max_sim(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        vector: &[f32],
        limit: usize,
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        self.check_dim(vector)?;
        let queries: Vec<QueryPoints> = [VectorField::User, VectorField::Assistant]
            .into_iter()
            .filter_map(|field| {
                search_request(
                    &self.turns,
                    tenant,
                    scope,
                    &VectorQuery::Dense {
                        field,
                        vector: vector.to_vec(),
                    },
                    limit,
                )
            })
            .collect();
        let res = self
            .client
            .query_batch(QueryBatchPointsBuilder::new(&self.turns, queries))
            .await
            .map_err(err)?;
        let answers: Vec<Vec<ScoredPoint>> = res.result.into_iter().map(|b| b.result).collect();
        Ok(field_max(&answers))
    }

    /// Server-side hybrid retrieval (RRF over user, assistant and lexical prefetches).
    pub async fn hybrid(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        dense: &[f32],
        lexical: &SparseVector,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, StoreError> {
        self.check_dim(dense)?;
        let res = self
            .client
            .query(hybrid_request(
                &self.turns,
                tenant,
                scope,
                dense,
                lexical,
                limit,
            ))
            .await
            .map_err(err)?;
        Ok(res
            .result
            .iter()
            .filter_map(|p| memory_id(&p.id).map(|m| (m, p.score)))
            .collect())
    }

    /// Keyword points in scope (erasure checks).
    pub async fn keyword_count(&self, tenant: &TenantId, scope: &Scope) -> Result<u64, StoreError> {
        let r = self
            .client
            .count(
                CountPointsBuilder::new(&self.keywords)
                    .filter(scope_filter(tenant, &scope.conversations_only()))
                    .exact(true),
            )
            .await
            .map_err(err)?;
        Ok(r.result.map(|c| c.count).unwrap_or(0))
    }
}

#[async_trait]
impl VectorIndex for QdrantVectorIndex {
    fn kind(&self) -> &'static str {
        ADAPTER
    }

    fn holds_token_vectors(&self) -> Option<bool> {
        Some(self.late_dim.is_some())
    }

    async fn upsert_turns(&self, points: Vec<TurnPoint>) -> Result<(), StoreError> {
        for p in &points {
            self.check_dim(&p.user)?;
            if let Some(a) = &p.assistant {
                self.check_dim(a)?;
            }
            if let (Some(t), Some(width)) = (&p.late, self.late_dim) {
                if t.dim != width || t.is_empty() {
                    return Err(StoreError::Invalid(format!(
                        "token vectors of width {} for a collection of {width}",
                        t.dim
                    )));
                }
            }
        }
        let late = self.late_dim.is_some();
        for chunk in points.chunks(UPSERT_BATCH) {
            if let Some(tokens) = &self.tokens {
                self.upsert_token_points(tokens, chunk, late).await?;
            }
            let in_turns = late && self.tokens.is_none();
            let structs: Vec<PointStruct> = chunk.iter().map(|p| turn_point(p, in_turns)).collect();
            // wait(true): the call returns once the points are applied and durable.
            self.client
                .upsert_points(
                    qdrant_client::qdrant::UpsertPointsBuilder::new(&self.turns, structs)
                        .wait(true),
                )
                .await
                .map_err(err)?;
        }
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
        match query {
            VectorQuery::Dense { vector, .. } => self.check_dim(vector)?,
            VectorQuery::Lexical(_) => {}
            VectorQuery::Late(question) => {
                let Some(mean) = self.late_scale(question)? else {
                    return Ok(vec![]);
                };
                scale = mean;
            }
        }
        let collection = match query {
            VectorQuery::Late(_) => self.late_collection(),
            _ => &self.turns,
        };
        let Some(req) = search_request(collection, tenant, scope, query, limit) else {
            return Ok(vec![]);
        };
        let history = scope.as_of.map(|at| {
            let mut h = req.clone();
            h.filter = Some(history_filter(tenant, scope, at));
            h.with_payload = Some(
                qdrant_client::qdrant::with_payload_selector::SelectorOptions::Include(
                    PayloadIncludeSelector::new(vec!["memory_id".into()]),
                )
                .into(),
            );
            h
        });
        let (req, history) = (&req, &history);
        super::search_settling_ties(limit, |asked| async move {
            let mut req = req.clone();
            req.limit = Some(asked as u64);
            let res = self.client.query(req).await.map_err(err)?;
            let current = res.result.iter();
            let mut searches = vec![current
                .map(|p| (memory_id(&p.id), p.score * scale))
                .collect()];
            // As of an earlier time, the versions current then that edits have since replaced.
            if let Some(h) = history {
                let mut h = h.clone();
                h.limit = Some(asked as u64);
                let res = self.client.query(h).await.map_err(err)?;
                searches.push(
                    res.result
                        .iter()
                        .map(|p| {
                            let m = text(&p.payload, "memory_id").and_then(|m| MemoryId::parse(&m));
                            (m, p.score * scale)
                        })
                        .collect(),
                );
            }
            Ok(searches)
        })
        .await
    }

    async fn field_vectors(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let pids: Vec<PointId> = ids.iter().map(|m| point_id(*m)).collect();
        self.dense_vectors(pids, tenant.as_str()).await
    }

    async fn late_scores(
        &self,
        tenant: &TenantId,
        question: &TokenVectors,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        if ids.is_empty() || question.is_empty() {
            return Ok(HashMap::new());
        }
        let Some(scale) = self.late_scale(question)? else {
            return Ok(HashMap::new());
        };
        let res = self
            .client
            .query(late_request(self.late_collection(), tenant, question, ids))
            .await
            .map_err(err)?;
        Ok(res
            .result
            .iter()
            .filter_map(|p| memory_id(&p.id).map(|m| (m, p.score * scale)))
            .collect())
    }

    /// The rows come to this process (the server's MaxSim sums over the whole turn): for
    /// `recall.sentence_depth` (20) turns of a few dozen 384-wide rows, about a megabyte a
    /// recall.
    async fn sentence_scores(
        &self,
        tenant: &TenantId,
        question: &TokenVectors,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        if ids.is_empty() || question.is_empty() || self.late_scale(question)?.is_none() {
            return Ok(HashMap::new());
        }
        let pids: Vec<PointId> = ids.iter().map(|m| point_id(*m)).collect();
        let res = self
            .client
            .get_points(
                GetPointsBuilder::new(self.late_collection(), pids)
                    .with_payload(PayloadIncludeSelector::new(vec![
                        "tenant".to_string(),
                        LATE_SEGMENTS.to_string(),
                    ]))
                    .with_vectors(VectorsSelector::new(vec![LATE_VECTOR.to_string()])),
            )
            .await
            .map_err(err)?;
        let mut out = HashMap::with_capacity(res.result.len());
        for r in res.result {
            if text(&r.payload, "tenant").as_deref() != Some(tenant.as_str()) {
                continue;
            }
            let Some(segments) = r.payload.get(LATE_SEGMENTS).and_then(segment_labels) else {
                continue;
            };
            let (Some(id), Some(vectors)) =
                (memory_id(&r.id), r.vectors.and_then(|v| v.vectors_options))
            else {
                continue;
            };
            let qdrant_client::qdrant::vectors_output::VectorsOptions::Vectors(mut named) = vectors
            else {
                continue;
            };
            let Some(vo) = named.vectors.remove(LATE_VECTOR) else {
                continue;
            };
            use qdrant_client::qdrant::vector_output::Vector as V;
            let V::MultiDense(m) = vo.into_vector() else {
                continue;
            };
            let values: Vec<f32> = m.vectors.into_iter().flat_map(|d| d.data).collect();
            let rows =
                TokenVectors::new(question.dim, values).and_then(|t| t.with_segments(segments));
            if let Some(score) = rows.ok().and_then(|t| t.sentence_max_sim(question)) {
                out.insert(id, score);
            }
        }
        Ok(out)
    }

    async fn keep_versions(
        &self,
        tenant: &TenantId,
        versions: &[ReplacedVersion],
    ) -> Result<(), StoreError> {
        if versions.is_empty() {
            return Ok(());
        }
        for collection in self.turn_collections() {
            self.keep_versions_in(collection, tenant, versions).await?;
        }
        Ok(())
    }

    async fn version_vectors(
        &self,
        tenant: &TenantId,
        versions: &[(MemoryId, chrono::DateTime<chrono::Utc>)],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        if versions.is_empty() {
            return Ok(HashMap::new());
        }
        let by_point: HashMap<MemoryId, MemoryId> = versions
            .iter()
            .map(|(m, at)| (version_point_id(*m, *at), *m))
            .collect();
        let pids: Vec<PointId> = by_point.keys().map(|m| point_id(*m)).collect();
        Ok(self
            .dense_vectors(pids, &history_tenant(tenant))
            .await?
            .into_iter()
            .filter_map(|(p, v)| by_point.get(&p).map(|m| (*m, v)))
            .collect())
    }

    /// Only the keywords a conversation does not have yet (one lookup by id first): most of a
    /// batch's keywords recur from earlier turns, and rewriting a point with the same vector
    /// still costs Qdrant a copy out of its indexed segment.
    async fn upsert_keyword_sets(&self, sets: Vec<KeywordSet>) -> Result<(), StoreError> {
        let mut points: Vec<(MemoryId, PointStruct)> = Vec::new();
        // One point per (conversation, keyword form); a form said twice in a batch is one point.
        let mut seen = std::collections::HashSet::new();
        for set in &sets {
            for k in &set.keywords {
                self.check_dim(&k.vector)?;
                let id = keyword_form_id(&set.tenant, &set.conversation, &k.keyword, &k.vector);
                if !seen.insert(id) {
                    continue;
                }
                let mut payload = Payload::new();
                payload.insert("tenant", set.tenant.as_str());
                payload.insert("conversation", set.conversation.as_str());
                payload.insert("keyword", k.keyword.as_str());
                let mut v: HashMap<String, Vector> = HashMap::new();
                v.insert(KEYWORD_VECTOR.into(), Vector::new_dense(k.vector.to_vec()));
                points.push((id, PointStruct::new(point_id(id), v, payload)));
            }
        }
        let mut known = std::collections::HashSet::new();
        for chunk in points.chunks(UPSERT_BATCH) {
            let ids: Vec<PointId> = chunk.iter().map(|(id, _)| point_id(*id)).collect();
            let res = self
                .client
                .get_points(
                    GetPointsBuilder::new(&self.keywords, ids)
                        .with_payload(false)
                        .with_vectors(false),
                )
                .await
                .map_err(err)?;
            known.extend(res.result.iter().filter_map(|r| memory_id(&r.id)));
        }
        let new: Vec<PointStruct> = points
            .into_iter()
            .filter(|(id, _)| !known.contains(id))
            .map(|(_, p)| p)
            .collect();
        for chunk in new.chunks(UPSERT_BATCH) {
            self.client
                .upsert_points(
                    qdrant_client::qdrant::UpsertPointsBuilder::new(&self.keywords, chunk.to_vec())
                        .wait(true),
                )
                .await
                .map_err(err)?;
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
        // A keyword has a point per conversation and form, so `limit` names may take more
        // points. Qdrant's group-by gives the same names but took 14 ms a keyword where points
        // took 2.2 (conv-47, 60 keywords, docs/EVALUATION.md session 23).
        let filter = scope_filter(tenant, &scope.conversations_only());
        super::search_keyword_names(limit, |asked| {
            let req = QueryPointsBuilder::new(&self.keywords)
                .query(Query::new_nearest(VectorInput::new_dense(vector.to_vec())))
                .using(KEYWORD_VECTOR)
                .filter(filter.clone())
                .limit(asked as u64)
                .score_threshold(min_score)
                .with_payload(PayloadIncludeSelector::new(vec!["keyword".to_string()]));
            async move {
                let res = self.client.query(req).await.map_err(err)?;
                Ok(res
                    .result
                    .into_iter()
                    .map(|p| (text(&p.payload, "keyword"), p.score))
                    .collect())
            }
        })
        .await
    }

    async fn delete_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        ids: &[MemoryId],
        keywords: &[String],
    ) -> Result<(), StoreError> {
        if !ids.is_empty() {
            let kept = Filter::must([
                Condition::matches("tenant", MatchValue::Keyword(history_tenant(tenant))),
                Condition::matches(
                    "memory_id",
                    ids.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
                ),
            ]);
            for collection in self.turn_collections() {
                self.client
                    .delete_points(
                        DeletePointsBuilder::new(collection)
                            .points(kept.clone())
                            .wait(true),
                    )
                    .await
                    .map_err(err)?;
                self.client
                    .delete_points(
                        DeletePointsBuilder::new(collection)
                            .points(PointsIdsList {
                                ids: ids.iter().map(|m| point_id(*m)).collect(),
                            })
                            .wait(true),
                    )
                    .await
                    .map_err(err)?;
            }
        }
        // Every form of each keyword the conversation no longer says, by payload: the ids hash
        // the forms' vectors, which an erasure does not have.
        if !keywords.is_empty() {
            let mut forms = filter_on(tenant.as_str(), &Scope::of(&[conversation]));
            forms
                .must
                .push(Condition::matches("keyword", keywords.to_vec()));
            self.client
                .delete_points(
                    DeletePointsBuilder::new(self.keywords.as_str())
                        .points(forms)
                        .wait(true),
                )
                .await
                .map_err(err)?;
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
        let kept = filter_on(&history_tenant(tenant), &scope);
        let mut deletes = Vec::new();
        for collection in self.turn_collections() {
            deletes.push((collection, scope_filter(tenant, &scope)));
            deletes.push((collection, kept.clone()));
        }
        deletes.push((self.keywords.as_str(), scope_filter(tenant, &scope)));
        for (collection, filter) in deletes {
            self.client
                .delete_points(
                    DeletePointsBuilder::new(collection)
                        .points(filter)
                        .wait(true),
                )
                .await
                .map_err(err)?;
        }
        Ok(n)
    }

    async fn count(&self, tenant: &TenantId, scope: &Scope) -> Result<u64, StoreError> {
        let r = self
            .client
            .count(
                CountPointsBuilder::new(&self.turns)
                    .filter(scope_filter(tenant, scope))
                    .exact(true),
            )
            .await
            .map_err(err)?;
        Ok(r.result.map(|c| c.count).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use qdrant_client::qdrant::{
        condition::ConditionOneOf, query::Variant, vector_input, vectors_config, Fusion,
    };

    fn tenant() -> TenantId {
        TenantId("t \"ü\"".into())
    }

    fn matches(f: &Filter) -> Vec<(String, MatchValue)> {
        f.must
            .iter()
            .filter_map(|c| match c.condition_one_of.as_ref()? {
                ConditionOneOf::Field(fc) => {
                    Some((fc.key.clone(), fc.r#match.as_ref()?.match_value.clone()?))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn turns_collection_has_named_fields_and_idf_lexical() {
        let c = turns_collection("rc_turns", 384, None);
        assert_eq!(c.collection_name, "rc_turns");
        let Some(vectors_config::Config::ParamsMap(m)) = c.vectors_config.and_then(|v| v.config)
        else {
            panic!("named vectors expected");
        };
        let mut names: Vec<_> = m.map.keys().cloned().collect();
        names.sort();
        assert_eq!(names, vec!["assistant", "user"]);
        for p in m.map.values() {
            assert_eq!(p.size, 384);
            assert_eq!(p.distance, Distance::Cosine as i32);
        }
        let hnsw = c.hnsw_config.unwrap();
        assert_eq!((hnsw.m, hnsw.payload_m), (Some(0), Some(16)));
        let sparse = c.sparse_vectors_config.unwrap().map;
        assert_eq!(sparse.len(), 1);
        assert_eq!(sparse["lexical"].modifier, Some(Modifier::Idf as i32));
        let k = keywords_collection("rc_kw", 8);
        let Some(vectors_config::Config::ParamsMap(m)) = k.vectors_config.and_then(|v| v.config)
        else {
            panic!("named keyword vector expected");
        };
        assert_eq!(m.map["keyword"].size, 8);
    }

    #[test]
    fn payload_indexes_make_tenant_a_tenant_index() {
        let idx = payload_indexes("rc_turns", true);
        let fields: Vec<_> = idx.iter().map(|i| i.field_name.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "tenant",
                "conversation",
                "user_id",
                "agent_id",
                "turn_id",
                "position",
                "timestamp"
            ]
        );
        assert_eq!(idx[0].field_type, Some(FieldType::Keyword as i32));
        let params = format!("{:?}", idx[0].field_index_params);
        assert!(params.contains("is_tenant: Some(true)"), "{params}");
        assert_eq!(idx[2].field_type, Some(FieldType::Keyword as i32));
        assert_eq!(idx[5].field_type, Some(FieldType::Integer as i32));
        assert_eq!(idx[6].field_type, Some(FieldType::Datetime as i32));
        assert!(idx.iter().all(|i| i.wait == Some(true)));
        assert_eq!(payload_indexes("rc_kw", false).len(), 2);
    }

    #[test]
    fn scope_filter_always_has_the_tenant() {
        let all = matches(&scope_filter(&tenant(), &Scope::all()));
        assert_eq!(
            all,
            vec![("tenant".into(), MatchValue::Keyword("t \"ü\"".into()))]
        );
        let two = matches(&scope_filter(&tenant(), &Scope::of(&["a", "b'c"])));
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].0, "conversation");
        let MatchValue::Keywords(k) = &two[1].1 else {
            panic!("conversation is an any-of match: {:?}", two[1].1);
        };
        assert_eq!(k.strings, vec!["a".to_string(), "b'c".to_string()]);
    }

    #[test]
    fn turn_point_maps_fields_vectors_and_payload() {
        let t = tenant();
        let p = TurnPoint {
            memory_id: MemoryId::derive(&t, "c", "7"),
            tenant: t.clone(),
            conversation_id: "c \"x\"".into(),
            turn_id: "7".into(),
            position: 7,
            timestamp: Utc::now(),
            user_speaker: Some("Zoë".into()),
            assistant_speaker: None,
            user: vec![0.5; 4],
            assistant: None,
            lexical: SparseVector {
                indices: vec![9, 3, 9],
                values: vec![1.0, 2.0, 3.0],
            },
            user_id: None,
            agent_id: None,
            metadata: Default::default(),
            recorded_at: chrono::Utc::now(),
            late: None,
        };
        let s = turn_point(&p, false);
        assert_eq!(memory_id(&s.id), Some(p.memory_id));
        assert_eq!(text(&s.payload, "tenant").as_deref(), Some("t \"ü\""));
        assert_eq!(text(&s.payload, "conversation").as_deref(), Some("c \"x\""));
        assert_eq!(text(&s.payload, "user_speaker").as_deref(), Some("Zoë"));
        assert_eq!(s.payload["position"].kind, Some(Kind::IntegerValue(7)));
        let v = format!("{:?}", s.vectors);
        assert!(v.contains("\"user\""), "{v}");
        assert!(
            !v.contains("\"assistant\""),
            "no assistant text, no assistant vector: {v}"
        );
        // Sparse indices sorted and deduplicated (first value kept), as the engine requires.
        assert!(v.contains("indices: [3, 9]"), "{v}");
        assert!(v.contains("values: [2.0, 1.0]"), "{v}");
        assert!(token_point(&p).is_none(), "no token vectors, no point");
        // Token vectors: in the turn point for the older layout; else a point of their own
        // with the turn's id and payload, and the rows' sentences.
        let rows = TokenVectors::new(2, vec![1.0, 0.0, 0.0, 1.0])
            .and_then(|t| t.with_segments(vec![recollect_model::Segment(0); 2]))
            .unwrap();
        let p = TurnPoint {
            late: Some(rows),
            ..p
        };
        assert!(!format!("{:?}", turn_point(&p, false).vectors).contains("\"late\""));
        assert!(format!("{:?}", turn_point(&p, true).vectors).contains("\"late\""));
        let t = token_point(&p).unwrap();
        assert_eq!(t.id, turn_point(&p, false).id);
        let v = format!("{:?}", t.vectors);
        assert!(v.contains("\"late\"") && !v.contains("\"user\""), "{v}");
        assert_eq!(text(&t.payload, "conversation").as_deref(), Some("c \"x\""));
        assert!(t.payload.contains_key(LATE_SEGMENTS));
    }

    #[test]
    fn tokens_collection_holds_token_vectors_only_and_is_never_indexed() {
        let c = tokens_collection("rc_tokens", 96);
        let Some(vectors_config::Config::ParamsMap(m)) = c.vectors_config.and_then(|v| v.config)
        else {
            panic!("named vectors expected");
        };
        assert_eq!(m.map.keys().collect::<Vec<_>>(), vec!["late"]);
        let late = &m.map["late"];
        assert_eq!(late.size, 96);
        assert!(late.multivector_config.is_some());
        assert_eq!(late.hnsw_config.as_ref().and_then(|h| h.m), Some(0));
        assert_eq!(c.optimizers_config.unwrap().indexing_threshold, Some(0));
    }

    #[test]
    fn search_request_names_the_field_and_filters_the_scope() {
        let q = VectorQuery::Dense {
            field: VectorField::Assistant,
            vector: vec![0.1, 0.2],
        };
        let r = search_request("rc_turns", &tenant(), &Scope::of(&["c1"]), &q, 5).unwrap();
        assert_eq!(r.collection_name, "rc_turns");
        assert_eq!(r.using.as_deref(), Some("assistant"));
        assert_eq!(r.limit, Some(5));
        assert_eq!(matches(r.filter.as_ref().unwrap()).len(), 2);
        let Some(Variant::Nearest(n)) = r.query.and_then(|q| q.variant) else {
            panic!("nearest query expected");
        };
        assert!(matches!(
            n.variant,
            Some(vector_input::Variant::Dense(ref d)) if d.data == vec![0.1, 0.2]
        ));
        let lex = VectorQuery::Lexical(SparseVector {
            indices: vec![4],
            values: vec![1.0],
        });
        let r = search_request("rc_turns", &tenant(), &Scope::all(), &lex, 3).unwrap();
        assert_eq!(r.using.as_deref(), Some("lexical"));
        assert!(search_request(
            "rc_turns",
            &tenant(),
            &Scope::all(),
            &VectorQuery::Lexical(SparseVector::default()),
            3
        )
        .is_none());
        // A late query: the question's rows as a multivector against `late`, in scope.
        let rows = TokenVectors::new(2, vec![1.0, 0.0, 0.0, 1.0]).unwrap();
        let late = VectorQuery::Late(rows);
        let r = search_request("rc_turns", &tenant(), &Scope::of(&["c1"]), &late, 7).unwrap();
        assert_eq!(r.using.as_deref(), Some("late"));
        assert_eq!(r.limit, Some(7));
        assert_eq!(matches(r.filter.as_ref().unwrap()).len(), 2);
        let Some(Variant::Nearest(n)) = r.query.and_then(|q| q.variant) else {
            panic!("nearest query expected");
        };
        assert!(matches!(
            n.variant,
            Some(vector_input::Variant::MultiDense(ref m)) if m.vectors.len() == 2
        ));
        let none = VectorQuery::Late(TokenVectors::default());
        assert!(search_request("rc_turns", &tenant(), &Scope::all(), &none, 3).is_none());
    }

    #[test]
    fn hybrid_request_prefetches_each_vector_and_fuses_by_rrf() {
        let lexical = SparseVector {
            indices: vec![1],
            values: vec![1.0],
        };
        let r = hybrid_request(
            "rc_turns",
            &tenant(),
            &Scope::of(&["c1"]),
            &[0.3; 4],
            &lexical,
            20,
        );
        let using: Vec<_> = r
            .prefetch
            .iter()
            .map(|p| p.using.clone().unwrap())
            .collect();
        assert_eq!(using, vec!["user", "assistant", "lexical"]);
        for p in &r.prefetch {
            assert_eq!(matches(p.filter.as_ref().unwrap()).len(), 2);
            assert_eq!(p.limit, Some(20));
        }
        assert!(matches!(
            r.query.and_then(|q| q.variant),
            Some(Variant::Fusion(f)) if f == Fusion::Rrf as i32
        ));
        let no_lex = hybrid_request(
            "rc_turns",
            &tenant(),
            &Scope::all(),
            &[0.3; 4],
            &SparseVector::default(),
            20,
        );
        assert_eq!(no_lex.prefetch.len(), 2);
    }

    #[test]
    fn settings_map_to_the_client_config() {
        let c = client_config(&QdrantSettings {
            url: "https://qdrant.example:6334".into(),
            api_key: "qk-secret".into(),
        });
        assert_eq!(c.uri, "https://qdrant.example:6334");
        assert_eq!(c.api_key.as_deref(), Some("qk-secret"));
        let c = client_config(&QdrantSettings {
            url: "http://127.0.0.1:6334".into(),
            api_key: String::new(),
        });
        assert_eq!(c.api_key, None, "no key, no header");
        let out = format!(
            "{:?}",
            QdrantSettings {
                url: "http://q:6334".into(),
                api_key: "qk-secret".into()
            }
        );
        assert!(
            !out.contains("qk-secret") && out.contains("<redacted>"),
            "{out}"
        );
    }

    #[test]
    fn field_max_keeps_the_best_field_per_turn() {
        let t = tenant();
        let a = MemoryId::derive(&t, "c", "a");
        let b = MemoryId::derive(&t, "c", "b");
        let sp = |id: MemoryId, score: f32| ScoredPoint {
            id: Some(point_id(id)),
            score,
            ..Default::default()
        };
        let m = field_max(&[vec![sp(a, 0.4), sp(b, 0.9)], vec![sp(a, 0.7)]]);
        assert_eq!(m[&a], 0.7);
        assert_eq!(m[&b], 0.9);
    }
}
