//! `Graph` on a Bolt server through neo4rs 0.9 (Bolt 4.4, which Neo4j 5 and ArcadeDB's Bolt
//! plugin both speak). Tested for real on ArcadeDB (scripts/arcadedb.sh, `make test`).
//!
//! Same schema and behaviour as the embedded graph: Turn nodes; Keyword, Entity, Location,
//! TimePoint and Reference nodes per tenant and conversation (as the embedded vocabulary is), so
//! scoped lookups and erasure touch one conversation's nodes only; Fragment and
//! ConversationState nodes. Every node carries `tenant` (and `conversation`); every edge carries
//! `valid_from`/`valid_to`/`recorded_at`/`expired_at` as microseconds since the epoch (integers
//! compare the same on every server). Writes MERGE on a `key` under unique constraints, in UNWIND
//! batches, each statement idempotent, so a retried statement cannot duplicate anything.
//!
//! The Cypher stays in what Neo4j 5 and ArcadeDB share: no APOC, no CALL subqueries, no COUNT {}.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use neo4rs::{query, BoltType, ConfigBuilder, Query, Row};
use recollect_model::{Extraction, Fragment, MemoryId, TenantId, Turn};
use recollect_telemetry as metrics;
use serde_json::{json, Value};

use crate::graph::{
    ConversationState, ErasureMap, Erasures, Graph, LinkedTurn, NodeKind, Scope, TurnRecord,
};
use crate::keys;
use crate::StoreError;

const ADAPTER: &str = "neo4j";
/// Rows per UNWIND statement: large enough to amortise a round trip, small enough that one
/// server transaction stays short.
const BATCH: usize = 1000;

/// Connection settings (graph.uri, graph.user, graph.password, graph.database).
#[derive(Debug, Clone)]
pub struct Neo4jSettings {
    pub uri: String,
    pub user: String,
    pub password: String,
    /// Always sent on the connection: servers disagree on what the default database is.
    pub database: String,
}

pub struct Neo4jGraph {
    graph: neo4rs::Graph,
}

/// A stable node key: a hash of its identifying parts (any text is safe in it).
fn node_key(parts: &[&str]) -> String {
    let h = blake3::hash(&keys::join(parts));
    h.to_hex()[..32].to_string()
}

fn structural_key(kind: NodeKind, tenant: &str, conversation: &str, name: &str) -> String {
    node_key(&[kind.label(), tenant, conversation, name])
}

fn fragment_key(tenant: &str, id: &str) -> String {
    node_key(&["Fragment", tenant, id])
}

fn state_key(tenant: &str, conversation: &str) -> String {
    node_key(&["ConversationState", tenant, conversation])
}

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn bolt(v: Value) -> Result<BoltType, StoreError> {
    BoltType::try_from(v).map_err(|e| StoreError::Invalid(format!("unencodable parameter: {e}")))
}

fn backend(e: neo4rs::Error) -> StoreError {
    StoreError::Backend(format!("neo4j: {e}"))
}

/// Errors worth another try: the server's transient class, lost connections, and ArcadeDB's
/// optimistic-concurrency conflicts (two writers merging one key: the loser retries and then
/// finds the node).
fn transient(e: &StoreError) -> bool {
    let StoreError::Backend(m) = e else {
        return false;
    };
    [
        "TransientError",
        "ConcurrentModification",
        "DuplicatedKey",
        "Duplicated key",
        "NeedRetry",
        "Transaction",
        "connection",
        "IO error",
    ]
    .iter()
    .any(|s| m.contains(s))
}

/// `AND x.conversation IN $convs` when the scope names conversations.
fn scope_clause(var: &str, scope: &Scope) -> String {
    match scope.conversations {
        Some(_) => format!(" AND {var}.conversation IN $convs"),
        None => String::new(),
    }
}

fn scope_param(q: Query, scope: &Scope) -> Query {
    match &scope.conversations {
        Some(c) => q.param("convs", c.clone()),
        None => q,
    }
}

fn get<'r, T: serde::Deserialize<'r>>(row: &'r Row, key: &str) -> Result<T, StoreError> {
    row.get::<T>(key)
        .map_err(|e| StoreError::Corrupt(format!("neo4j row field {key}: {e}")))
}

impl Neo4jGraph {
    /// Connects, names the database on every session, and creates the schema idempotently.
    pub async fn connect(s: &Neo4jSettings) -> Result<Self, StoreError> {
        let config = ConfigBuilder::default()
            .uri(s.uri.as_str())
            .user(s.user.as_str())
            .password(s.password.as_str())
            .db(s.database.as_str())
            .fetch_size(2000)
            .max_connections(16)
            .build()
            .map_err(backend)?;
        let graph = neo4rs::Graph::connect(config).map_err(backend)?;
        let g = Self { graph };
        g.ensure_schema().await?;
        g.ensure_erasure_schema().await?;
        Ok(g)
    }

    /// Every constraint and index the adapter relies on, in one place, since servers differ
    /// here. Unique constraints on `key` make concurrent MERGE safe (without one, ArcadeDB
    /// duplicates nodes); range indexes serve the tenant/conversation/name lookups. No full-text
    /// or vector index: text search and vectors live in the vector store.
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        let mut labels: Vec<&str> = vec!["Turn", "Fragment", "ConversationState"];
        labels.extend(NodeKind::ALL.iter().map(|k| k.label()));
        let mut statements = Vec::new();
        for l in &labels {
            let low = l.to_lowercase();
            statements.push(format!(
                "CREATE CONSTRAINT {low}_key IF NOT EXISTS FOR (n:{l}) REQUIRE n.key IS UNIQUE"
            ));
            statements.push(format!(
                "CREATE INDEX {low}_conversation IF NOT EXISTS FOR (n:{l}) ON (n.tenant, n.conversation)"
            ));
        }
        for k in NodeKind::ALL {
            let (l, low) = (k.label(), k.label().to_lowercase());
            statements.push(format!(
                "CREATE INDEX {low}_name IF NOT EXISTS FOR (n:{l}) ON (n.tenant, n.name)"
            ));
        }
        for s in statements {
            self.run(query(&s)).await?;
        }
        Ok(())
    }

    /// One auto-commit statement, retried on transient errors (every statement is idempotent).
    async fn run(&self, q: Query) -> Result<(), StoreError> {
        (|| async { self.graph.run(q.clone()).await.map(drop).map_err(backend) })
            .retry(retry_policy())
            .when(transient)
            .await
    }

    /// One statement's rows, retried on transient errors.
    async fn rows(&self, q: Query) -> Result<Vec<Row>, StoreError> {
        (|| async {
            let mut stream = self.graph.execute(q.clone()).await.map_err(backend)?;
            let mut out = Vec::new();
            while let Some(row) = stream.next().await.map_err(backend)? {
                out.push(row);
            }
            Ok(out)
        })
        .retry(retry_policy())
        .when(transient)
        .await
    }

    async fn count(&self, q: Query) -> Result<u64, StoreError> {
        let rows = self.rows(q).await?;
        match rows.first() {
            Some(r) => Ok(get::<i64>(r, "n")?.max(0) as u64),
            None => Ok(0),
        }
    }

    /// Times a write and counts its failure, under this adapter's label.
    async fn observed<T>(
        &self,
        write: bool,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let r = f.await;
        match &r {
            Ok(_) if write => metrics::STORE_WRITE_LATENCY
                .with_label_values(&[ADAPTER])
                .observe(started.elapsed().as_secs_f64()),
            Ok(_) => {}
            Err(_) => metrics::STORE_ERRORS.with_label_values(&[ADAPTER]).inc(),
        }
        r
    }

    /// Turn records from rows with `id`, `turn_json` and `extraction_json`, fragments attached.
    async fn records(&self, rows: Vec<Row>) -> Result<Vec<TurnRecord>, StoreError> {
        let mut out = Vec::with_capacity(rows.len());
        let mut ids = Vec::with_capacity(rows.len());
        for r in &rows {
            let turn: Turn = serde_json::from_str(&get::<String>(r, "turn_json")?)?;
            let extraction: Extraction =
                serde_json::from_str(&get::<String>(r, "extraction_json")?)?;
            ids.push(get::<String>(r, "id")?);
            out.push(TurnRecord {
                turn,
                extraction,
                fragments: Vec::new(),
            });
        }
        if ids.is_empty() {
            return Ok(out);
        }
        let frows = self
            .rows(
                query(
                    "MATCH (t:Turn)-[:PART_OF]->(f:Fragment) WHERE t.key IN $ids \
                     RETURN t.key AS id, f.fid AS fid, f.created AS created",
                )
                .param("ids", ids.clone()),
            )
            .await?;
        let mut by_turn: HashMap<String, Vec<(i64, String)>> = HashMap::new();
        for r in &frows {
            by_turn
                .entry(get(r, "id")?)
                .or_default()
                .push((get(r, "created")?, get(r, "fid")?));
        }
        for (rec, id) in out.iter_mut().zip(ids) {
            if let Some(mut f) = by_turn.remove(&id) {
                // The order fragments were made in, as the embedded graph appends them.
                f.sort();
                rec.fragments = f.into_iter().map(|(_, fid)| fid).collect();
            }
        }
        Ok(out)
    }

    async fn write_turn_batch(&self, turns: &[(Turn, Extraction)]) -> Result<(), StoreError> {
        let now = micros(Utc::now());
        let mut rows = Vec::with_capacity(turns.len());
        let mut links: HashMap<NodeKind, Vec<Value>> = HashMap::new();
        let mut keep: HashMap<NodeKind, Vec<Value>> = HashMap::new();
        for (t, x) in turns {
            let id = t.memory_id.to_string();
            let tenant = t.tenant.as_str();
            let conv = t.conversation_id.as_str();
            rows.push(json!({
                "key": id,
                "tenant": tenant,
                "conversation": conv,
                "turn_id": t.turn_id,
                "position": i64::try_from(t.position).unwrap_or(i64::MAX),
                "timestamp": t.timestamp.to_rfc3339(),
                "user": t.user,
                "assistant": t.assistant,
                "turn_json": serde_json::to_string(t)?,
                "extraction_json": serde_json::to_string(x)?,
            }));
            let valid_from = micros(x.event_time.unwrap_or(t.timestamp));
            for kind in NodeKind::ALL {
                let names = kind.names(x);
                let node_keys: Vec<String> = names
                    .iter()
                    .map(|n| structural_key(kind, tenant, conv, n))
                    .collect();
                keep.entry(kind)
                    .or_default()
                    .push(json!({"turn": id, "keep": node_keys}));
                for (name, key) in names.iter().zip(node_keys) {
                    links.entry(kind).or_default().push(json!({
                        "turn": id,
                        "key": key,
                        "tenant": tenant,
                        "conversation": conv,
                        "name": name,
                        "valid_from": valid_from,
                    }));
                }
            }
        }
        self.run(
            query(
                "UNWIND $rows AS r MERGE (t:Turn {key: r.key}) \
                 SET t.tenant = r.tenant, t.conversation = r.conversation, t.turn_id = r.turn_id, \
                 t.position = r.position, t.timestamp = r.timestamp, t.user = r.user, \
                 t.assistant = r.assistant, t.turn_json = r.turn_json, \
                 t.extraction_json = r.extraction_json",
            )
            .param("rows", bolt(Value::Array(rows))?),
        )
        .await?;
        for kind in NodeKind::ALL {
            let (label, edge) = (kind.label(), kind.edge());
            // A re-derived extraction replaces its own links; nothing else is touched.
            if let Some(k) = keep.remove(&kind) {
                self.run(
                    query(&format!(
                        "UNWIND $rows AS r MATCH (t:Turn {{key: r.turn}})-[e:{edge}]->(n:{label}) \
                         WHERE NOT n.key IN r.keep DELETE e"
                    ))
                    .param("rows", bolt(Value::Array(k))?),
                )
                .await?;
            }
            let Some(l) = links.remove(&kind) else {
                continue;
            };
            // Nodes first, then edges: two short statements keep the unique-key conflicts of
            // concurrent writers on the node MERGE, where a retry resolves them.
            self.run(
                query(&format!(
                    "UNWIND $rows AS r MERGE (n:{label} {{key: r.key}}) \
                     ON CREATE SET n.tenant = r.tenant, n.conversation = r.conversation, n.name = r.name"
                ))
                .param("rows", bolt(Value::Array(l.clone()))?),
            )
            .await?;
            self.run(
                query(&format!(
                    "UNWIND $rows AS r MATCH (t:Turn {{key: r.turn}}) MATCH (n:{label} {{key: r.key}}) \
                     MERGE (t)-[e:{edge}]->(n) \
                     ON CREATE SET e.valid_from = r.valid_from, e.recorded_at = $now"
                ))
                .param("rows", bolt(Value::Array(l))?)
                .param("now", now),
            )
            .await?;
        }
        Ok(())
    }

    /// Nodes of a tenant's conversation left in the server, by label (erasure checks).
    pub async fn residue(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<HashMap<String, u64>, StoreError> {
        let mut labels: Vec<&str> = vec!["Turn", "Fragment", "ConversationState"];
        labels.extend(NodeKind::ALL.iter().map(|k| k.label()));
        let mut out = HashMap::new();
        for l in labels {
            let n = self
                .count(
                    query(&format!(
                        "MATCH (n:{l}) WHERE n.tenant = $tenant AND n.conversation = $conv \
                         RETURN count(n) AS n"
                    ))
                    .param("tenant", tenant.as_str())
                    .param("conv", conversation),
                )
                .await?;
            out.insert(l.to_string(), n);
        }
        Ok(out)
    }
}

fn retry_policy() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_secs(2))
        .with_max_times(10)
        .with_jitter()
}

#[async_trait]
impl Graph for Neo4jGraph {
    fn kind(&self) -> &'static str {
        ADAPTER
    }

    async fn write_turns(&self, turns: &[(Turn, Extraction)]) -> Result<(), StoreError> {
        // Erasure guard (see `unerased_turns`).
        let kept = self.unerased_turns(turns).await?;
        let turns = kept.as_slice();
        self.observed(true, async {
            for chunk in turns.chunks(BATCH) {
                self.write_turn_batch(chunk).await?;
            }
            Ok(())
        })
        .await
    }

    async fn write_fragments(&self, fragments: &[Fragment]) -> Result<(), StoreError> {
        // Erasure guard (see `unerased_fragments`).
        let kept = self.unerased_fragments(fragments).await?;
        let fragments = kept.as_slice();
        self.observed(true, async {
            let now = micros(Utc::now());
            let mut nodes = Vec::new();
            let mut members = Vec::new();
            for f in fragments {
                let key = fragment_key(f.tenant.as_str(), &f.id);
                nodes.push(json!({
                    "key": key,
                    "fid": f.id,
                    "tenant": f.tenant.as_str(),
                    "conversation": f.conversation_id,
                    "json": serde_json::to_string(f)?,
                    "created": micros(f.created_at),
                }));
                for m in &f.members {
                    members.push(json!({
                        "turn": m.to_string(),
                        "key": key,
                        "tenant": f.tenant.as_str(),
                        "valid_from": micros(f.created_at),
                    }));
                }
            }
            for chunk in nodes.chunks(BATCH) {
                self.run(
                    query(
                        "UNWIND $rows AS r MERGE (f:Fragment {key: r.key}) \
                         SET f.fid = r.fid, f.tenant = r.tenant, f.conversation = r.conversation, \
                         f.json = r.json, f.created = r.created",
                    )
                    .param("rows", bolt(Value::Array(chunk.to_vec()))?),
                )
                .await?;
            }
            for chunk in members.chunks(BATCH) {
                // Members of another tenant are never linked (the tenant check is in the MATCH).
                self.run(
                    query(
                        "UNWIND $rows AS r MATCH (t:Turn {key: r.turn}) WHERE t.tenant = r.tenant \
                         MATCH (f:Fragment {key: r.key}) MERGE (t)-[e:PART_OF]->(f) \
                         ON CREATE SET e.valid_from = r.valid_from, e.recorded_at = $now",
                    )
                    .param("rows", bolt(Value::Array(chunk.to_vec()))?)
                    .param("now", now),
                )
                .await?;
            }
            Ok(())
        })
        .await
    }

    async fn turns(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.observed(false, async {
            if ids.is_empty() {
                return Ok(vec![]);
            }
            let keys: Vec<String> = ids.iter().map(|m| m.to_string()).collect();
            let rows = self
                .rows(
                    query(
                        "MATCH (t:Turn) WHERE t.key IN $ids AND t.tenant = $tenant \
                         RETURN t.key AS id, t.turn_json AS turn_json, t.extraction_json AS extraction_json",
                    )
                    .param("ids", keys)
                    .param("tenant", tenant.as_str()),
                )
                .await?;
            let mut recs = self.records(rows).await?;
            // In the order asked for, as the embedded graph answers.
            let order: HashMap<MemoryId, usize> =
                ids.iter().enumerate().map(|(i, m)| (*m, i)).collect();
            recs.sort_by_key(|r| order.get(&r.turn.memory_id).copied().unwrap_or(usize::MAX));
            Ok(recs)
        })
        .await
    }

    async fn conversation_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.observed(false, async {
            let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            let rows = self
                .rows(
                    query(
                        "MATCH (t:Turn) WHERE t.tenant = $tenant AND t.conversation = $conv \
                         AND t.position >= $from AND t.position < $to \
                         RETURN t.key AS id, t.turn_json AS turn_json, \
                         t.extraction_json AS extraction_json, t.position AS position \
                         ORDER BY t.position",
                    )
                    .param("tenant", tenant.as_str())
                    .param("conv", conversation)
                    .param("from", clamp(from))
                    .param("to", clamp(to)),
                )
                .await?;
            let mut recs = self.records(rows).await?;
            recs.sort_by_key(|r| r.turn.position);
            Ok(recs)
        })
        .await
    }

    async fn conversations(&self, tenant: &TenantId) -> Result<Vec<String>, StoreError> {
        self.observed(false, async {
            let rows = self
                .rows(
                    query(
                        "MATCH (t:Turn) WHERE t.tenant = $tenant \
                         RETURN DISTINCT t.conversation AS conversation",
                    )
                    .param("tenant", tenant.as_str()),
                )
                .await?;
            let mut out = rows
                .iter()
                .map(|r| get::<String>(r, "conversation"))
                .collect::<Result<Vec<_>, _>>()?;
            out.sort();
            Ok(out)
        })
        .await
    }

    async fn vocabulary(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
    ) -> Result<Vec<String>, StoreError> {
        self.observed(false, async {
            let (label, edge) = (kind.label(), kind.edge());
            let q = query(&format!(
                "MATCH (t:Turn)-[:{edge}]->(n:{label}) WHERE n.tenant = $tenant{} \
                 RETURN DISTINCT n.name AS name",
                scope_clause("n", scope)
            ))
            .param("tenant", tenant.as_str());
            let rows = self.rows(scope_param(q, scope)).await?;
            let mut out = rows
                .iter()
                .map(|r| get::<String>(r, "name"))
                .collect::<Result<Vec<_>, _>>()?;
            out.sort();
            out.dedup();
            Ok(out)
        })
        .await
    }

    async fn linked_turns(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
        names: &[String],
        recorded_by: Option<DateTime<Utc>>,
        valid_at: Option<DateTime<Utc>>,
    ) -> Result<Vec<LinkedTurn>, StoreError> {
        self.observed(false, async {
            if names.is_empty() {
                return Ok(vec![]);
            }
            let (label, edge) = (kind.label(), kind.edge());
            // The same visibility rule as EdgeTimes::visible.
            let mut when = match recorded_by {
                Some(_) => String::from(
                    " AND e.recorded_at <= $rb AND (e.expired_at IS NULL OR e.expired_at > $rb)",
                ),
                None => String::from(" AND e.expired_at IS NULL"),
            };
            if valid_at.is_some() {
                when.push_str(
                    " AND e.valid_from <= $va AND (e.valid_to IS NULL OR e.valid_to > $va)",
                );
            }
            let mut q = query(&format!(
                "MATCH (t:Turn)-[e:{edge}]->(n:{label}) \
                 WHERE n.tenant = $tenant AND n.name IN $names{}{when} \
                 RETURN n.name AS name, t.key AS id, t.conversation AS conversation",
                scope_clause("n", scope)
            ))
            .param("tenant", tenant.as_str())
            .param("names", names.to_vec());
            if let Some(rb) = recorded_by {
                q = q.param("rb", micros(rb));
            }
            if let Some(va) = valid_at {
                q = q.param("va", micros(va));
            }
            let rows = self.rows(scope_param(q, scope)).await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let id: String = get(r, "id")?;
                let memory_id = MemoryId::parse(&id)
                    .ok_or_else(|| StoreError::Corrupt(format!("turn key {id} is no memory id")))?;
                out.push(LinkedTurn {
                    name: get(r, "name")?,
                    memory_id,
                    conversation_id: get(r, "conversation")?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn document_frequencies(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
        names: &[String],
    ) -> Result<(u64, Vec<u64>), StoreError> {
        self.observed(false, async {
            let q = query(&format!(
                "MATCH (t:Turn) WHERE t.tenant = $tenant{} RETURN count(t) AS n",
                scope_clause("t", scope)
            ))
            .param("tenant", tenant.as_str());
            let total = self.count(scope_param(q, scope)).await?;
            if names.is_empty() {
                return Ok((total, vec![]));
            }
            let (label, edge) = (kind.label(), kind.edge());
            let q = query(&format!(
                "MATCH (t:Turn)-[:{edge}]->(n:{label}) \
                 WHERE n.tenant = $tenant AND n.name IN $names{} \
                 RETURN n.name AS name, count(t) AS n",
                scope_clause("n", scope)
            ))
            .param("tenant", tenant.as_str())
            .param("names", names.to_vec());
            let rows = self.rows(scope_param(q, scope)).await?;
            let mut by_name: HashMap<String, u64> = HashMap::new();
            for r in &rows {
                *by_name.entry(get(r, "name")?).or_default() += get::<i64>(r, "n")?.max(0) as u64;
            }
            let df = names
                .iter()
                .map(|n| by_name.get(n).copied().unwrap_or(0))
                .collect();
            Ok((total, df))
        })
        .await
    }

    async fn fragments(
        &self,
        tenant: &TenantId,
        ids: &[String],
    ) -> Result<Vec<Fragment>, StoreError> {
        self.observed(false, async {
            if ids.is_empty() {
                return Ok(vec![]);
            }
            let keys: Vec<String> = ids
                .iter()
                .map(|i| fragment_key(tenant.as_str(), i))
                .collect();
            let rows = self
                .rows(
                    query(
                        "MATCH (f:Fragment) WHERE f.key IN $keys AND f.tenant = $tenant \
                         RETURN f.fid AS fid, f.json AS json",
                    )
                    .param("keys", keys)
                    .param("tenant", tenant.as_str()),
                )
                .await?;
            let mut by_id: HashMap<String, Fragment> = HashMap::new();
            for r in &rows {
                by_id.insert(
                    get(r, "fid")?,
                    serde_json::from_str(&get::<String>(r, "json")?)?,
                );
            }
            Ok(ids.iter().filter_map(|i| by_id.remove(i)).collect())
        })
        .await
    }

    async fn conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<ConversationState, StoreError> {
        self.observed(false, async {
            let rows = self
                .rows(
                    query("MATCH (s:ConversationState {key: $key}) RETURN s.json AS json")
                        .param("key", state_key(tenant.as_str(), conversation)),
                )
                .await?;
            match rows.first() {
                Some(r) => Ok(serde_json::from_str(&get::<String>(r, "json")?)?),
                None => Ok(ConversationState::default()),
            }
        })
        .await
    }

    async fn save_conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
        state: &ConversationState,
    ) -> Result<bool, StoreError> {
        if let Some(m) = self
            .erasures(tenant, &[conversation.to_string()])
            .await?
            .marker(conversation)
        {
            if state.covered_by(m) {
                return Ok(false);
            }
        }
        self.observed(true, async {
            self.run(
                query(
                    "MERGE (s:ConversationState {key: $key}) \
                     SET s.tenant = $tenant, s.conversation = $conv, s.json = $json",
                )
                .param("key", state_key(tenant.as_str(), conversation))
                .param("tenant", tenant.as_str())
                .param("conv", conversation)
                .param("json", serde_json::to_string(state)?),
            )
            .await
            .map(|()| true)
        })
        .await
    }

    async fn record_erasure(
        &self,
        tenant: &TenantId,
        conversation: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let conv = conversation.unwrap_or("");
        let key = erasure_key(tenant.as_str(), conv);
        let at = micros_up(at);
        self.observed(true, async {
            self.run(
                query(
                    "MERGE (x:Erasure {key: $key}) \
                     ON CREATE SET x.tenant = $tenant, x.conversation = $conv, x.at = $at",
                )
                .param("key", key.as_str())
                .param("tenant", tenant.as_str())
                .param("conv", conv)
                .param("at", at),
            )
            .await?;
            // An older marker moves forward; a later one stays.
            self.run(
                query("MATCH (x:Erasure {key: $key}) WHERE x.at < $at SET x.at = $at")
                    .param("key", key.as_str())
                    .param("at", at),
            )
            .await
        })
        .await
    }

    async fn erasures(
        &self,
        tenant: &TenantId,
        conversations: &[String],
    ) -> Result<Erasures, StoreError> {
        self.observed(false, async {
            let mut keys = vec![erasure_key(tenant.as_str(), "")];
            keys.extend(
                conversations
                    .iter()
                    .map(|c| erasure_key(tenant.as_str(), c)),
            );
            let rows = self
                .rows(
                    query(
                        "MATCH (x:Erasure) WHERE x.key IN $keys AND x.tenant = $tenant \
                         RETURN x.conversation AS conversation, x.at AS at",
                    )
                    .param("keys", keys)
                    .param("tenant", tenant.as_str()),
                )
                .await?;
            let mut e = Erasures::default();
            for r in &rows {
                let conv: String = get(r, "conversation")?;
                let at = DateTime::from_timestamp_micros(get::<i64>(r, "at")?)
                    .ok_or_else(|| StoreError::Corrupt("erasure time out of range".into()))?;
                if conv.is_empty() {
                    e.tenant = Some(at);
                } else {
                    e.conversations.insert(conv, at);
                }
            }
            Ok(e)
        })
        .await
    }

    async fn purge_erased(&self, tenant: &TenantId, conversation: &str) -> Result<u64, StoreError> {
        self.observed(true, self.purge(tenant, conversation)).await
    }

    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError> {
        self.observed(true, async {
            let n = self
                .count(
                    query(
                        "MATCH (t:Turn) WHERE t.tenant = $tenant AND t.conversation = $conv \
                         RETURN count(t) AS n",
                    )
                    .param("tenant", tenant.as_str())
                    .param("conv", conversation),
                )
                .await?;
            let mut labels: Vec<&str> = vec!["Turn", "Fragment", "ConversationState"];
            labels.extend(NodeKind::ALL.iter().map(|k| k.label()));
            for l in labels {
                self.run(
                    query(&format!(
                        "MATCH (n:{l}) WHERE n.tenant = $tenant AND n.conversation = $conv \
                         DETACH DELETE n"
                    ))
                    .param("tenant", tenant.as_str())
                    .param("conv", conversation),
                )
                .await?;
            }
            Ok(n)
        })
        .await
    }
}

/// Key of an :Erasure node; the empty conversation stands for the whole tenant (conversation ids
/// are never empty).
fn erasure_key(tenant: &str, conversation: &str) -> String {
    node_key(&["Erasure", tenant, conversation])
}

/// Microseconds rounded up: a marker must not move earlier than the erase, or a turn recorded
/// in the same microsecond just before it would escape.
fn micros_up(t: DateTime<Utc>) -> i64 {
    let m = t.timestamp_micros();
    if t.timestamp_subsec_nanos().is_multiple_of(1000) {
        m
    } else {
        m + 1
    }
}

/// Erasure markers and the writes they guard. Kept apart from the write path on purpose.
///
/// The guard reads the markers in its own statement, just before the write. Under the server's
/// read-committed isolation, a marker read inside the write's transaction would not serialise
/// against an eraser committing concurrently either; what makes erasure hold is the order the
/// callers follow: erasers commit the marker before deleting anything, and writers re-read the
/// markers after writing and call `purge_erased` for whatever became covered.
impl Neo4jGraph {
    async fn ensure_erasure_schema(&self) -> Result<(), StoreError> {
        self.run(query(
            "CREATE CONSTRAINT erasure_key IF NOT EXISTS FOR (n:Erasure) REQUIRE n.key IS UNIQUE",
        ))
        .await
    }

    /// The turns no marker covers.
    async fn unerased_turns(
        &self,
        turns: &[(Turn, Extraction)],
    ) -> Result<Vec<(Turn, Extraction)>, StoreError> {
        let m = ErasureMap::read(
            self,
            turns
                .iter()
                .map(|(t, _)| (t.tenant.clone(), t.conversation_id.clone())),
        )
        .await?;
        Ok(turns
            .iter()
            .filter(|(t, _)| !m.covers(&t.tenant, &t.conversation_id, t.recorded_at))
            .cloned()
            .collect())
    }

    /// The fragments of conversations without a marker, and those whose members all exist and
    /// were recorded after it.
    async fn unerased_fragments(
        &self,
        fragments: &[Fragment],
    ) -> Result<Vec<Fragment>, StoreError> {
        let m = ErasureMap::read(
            self,
            fragments
                .iter()
                .map(|f| (f.tenant.clone(), f.conversation_id.clone())),
        )
        .await?;
        let mut out = Vec::with_capacity(fragments.len());
        for f in fragments {
            if let Some(marker) = m.marker(&f.tenant, &f.conversation_id) {
                let members = self.turns(&f.tenant, &f.members).await?;
                if members.len() < f.members.len()
                    || members.iter().any(|r| r.turn.recorded_at <= marker)
                {
                    continue;
                }
            }
            out.push(f.clone());
        }
        Ok(out)
    }

    async fn purge(&self, tenant: &TenantId, conversation: &str) -> Result<u64, StoreError> {
        let Some(marker) = self
            .erasures(tenant, &[conversation.to_string()])
            .await?
            .marker(conversation)
        else {
            return Ok(0);
        };
        let rows = self
            .rows(
                query(
                    "MATCH (t:Turn) WHERE t.tenant = $tenant AND t.conversation = $conv \
                     RETURN t.key AS id, t.turn_json AS turn_json",
                )
                .param("tenant", tenant.as_str())
                .param("conv", conversation),
            )
            .await?;
        let mut ids = Vec::new();
        for r in &rows {
            let turn: Turn = serde_json::from_str(&get::<String>(r, "turn_json")?)?;
            if turn.recorded_at <= marker {
                ids.push(get::<String>(r, "id")?);
            }
        }
        let scoped = |q: &str| {
            query(q)
                .param("tenant", tenant.as_str())
                .param("conv", conversation)
        };
        if !ids.is_empty() {
            // Fragments with an erased member first, while the PART_OF edges still lead to them.
            for chunk in ids.chunks(BATCH) {
                self.run(
                    query(
                        "MATCH (t:Turn)-[:PART_OF]->(f:Fragment) WHERE t.key IN $ids \
                         DETACH DELETE f",
                    )
                    .param("ids", chunk.to_vec()),
                )
                .await?;
                self.run(
                    query("MATCH (t:Turn) WHERE t.key IN $ids DETACH DELETE t")
                        .param("ids", chunk.to_vec()),
                )
                .await?;
            }
        }
        // Fragments and structural nodes of the conversation left without any turn.
        let mut labels: Vec<&str> = vec!["Fragment"];
        labels.extend(NodeKind::ALL.iter().map(|k| k.label()));
        for l in labels {
            self.run(scoped(&format!(
                "MATCH (n:{l}) WHERE n.tenant = $tenant AND n.conversation = $conv \
                 OPTIONAL MATCH (n)-[e]-(:Turn) WITH n, count(e) AS k WHERE k = 0 \
                 DETACH DELETE n"
            )))
            .await?;
        }
        if self
            .conversation_state(tenant, conversation)
            .await?
            .covered_by(marker)
        {
            self.run(
                query("MATCH (s:ConversationState {key: $key}) DETACH DELETE s")
                    .param("key", state_key(tenant.as_str(), conversation)),
            )
            .await?;
        }
        Ok(ids.len() as u64)
    }
}
