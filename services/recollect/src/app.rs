//! The embedded wiring: every worker in one process over the in-process bus, the stores under
//! one data directory. Opening an `App` replays whatever a crash left unfinished.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use recollect_bus::{run_stage, Bus, InProcessBus, Stage};
use recollect_config::Settings;
use recollect_consolidator::ConsolidatorStage;
use recollect_embed::{CachedEmbedder, CachedTokenEmbedder, Embedder, TokenEmbedder};
use recollect_embedder::EmbedderStage;
use recollect_extractor::ExtractorStage;
use recollect_gateway::{Eraser, Gateway, Limits};
use recollect_graph_writer::{GraphWriterStage, StoreHooks};
use recollect_model::{topics, MemoryId, RecollectError, TenantId, Turn};
use recollect_recall::{Recall, RecallLimits};
use recollect_storage::{open_graph, open_vectors_with, Flushes, Graph, RawStore, VectorIndex};
use recollect_telemetry::events::{ComponentSelected, InternalEvent};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

pub struct App {
    pub settings: Settings,
    pub raw: RawStore,
    pub graph: Arc<dyn Graph>,
    pub vectors: Arc<dyn VectorIndex>,
    pub embedder: Arc<dyn Embedder>,
    pub gateway: Arc<Gateway>,
    pub recall: Arc<Recall>,
    pub eraser: Arc<dyn Eraser>,
    pub backup: Arc<DataDirBackup>,
    /// What recall keeps by question text (the bench empties it before each new question).
    pub query_caches: QueryCaches,
    shutdown: watch::Sender<bool>,
    stages: Vec<JoinHandle<Result<(), recollect_bus::BusError>>>,
    hooks: Arc<EmbeddedHooks>,
    settling: JoinHandle<()>,
}

/// How often, at most, the vector index is flushed while the writer keeps writing: one flush
/// then covers several of its batches (a group commit). A flush costs about the same for one
/// batch as for several, and two of them a batch were ~8 % of the ingest's CPU. When writes
/// are sparse the flush follows the batch at once, so a lone `wait` is not held back; under a
/// steady load a `wait` waits up to this long more. 1 s rather than 0.5 s: +2 to +7.5 % turns/s
/// end to end at 100k in two windows (the writer's batches take ~0.5 s there, so 0.5 s flushed
/// after every one); 1.5 s measured the same as 1 s (docs/SPEED.md).
const SYNC_EVERY: std::time::Duration = std::time::Duration::from_millis(1000);

/// The graph writer's hook: a turn is marked stored (no longer replayed at start) only once
/// its vector points are flushed, which [`EmbeddedHooks::run`] does for many batches at once.
/// The graph's own write is durable when the writer's batch returns; what a crash loses of
/// the vector index is replayed from the raw store, as a crash mid-batch always was.
struct EmbeddedHooks {
    raw: RawStore,
    vectors: Arc<dyn VectorIndex>,
    stored: Arc<Notify>,
    /// Handled by the writer, not yet flushed.
    handled: std::sync::Mutex<Vec<(MemoryId, chrono::DateTime<chrono::Utc>)>>,
    wake: Notify,
    /// The writer found its input drained with turns handled and not yet flushed.
    drained: Notify,
    /// The bus, to tell a burst's end (every stage before the writer drained too) from the
    /// writer catching up mid-stream, when the flush waits for its second.
    bus: Arc<InProcessBus>,
}

impl StoreHooks for EmbeddedHooks {
    fn stored(&self, turns: &[(MemoryId, chrono::DateTime<chrono::Utc>)]) {
        self.handled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(turns);
        self.wake.notify_one();
    }

    /// Nothing more to write for now: what was handled settles without waiting out the second.
    /// Only with turns to settle, so that an idle pipeline leaves no wake-up for later, and
    /// only when the stages before the writer have nothing waiting either: a writer that
    /// caught up mid-stream would otherwise flush after every batch.
    fn idle(&self) {
        let upstream = [topics::RAW, topics::EXTRACTED, topics::EMBEDDED];
        if upstream.iter().all(|t| self.bus.depth(t) == 0)
            && !self
                .handled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        {
            self.drained.notify_one();
        }
    }
}

impl EmbeddedHooks {
    /// Flushes the vector index, then clears the pending marks of every turn handled before
    /// the flush began. Returns false when the flush failed (the turns stay to try again).
    async fn settle(&self) -> bool {
        let turns = std::mem::take(&mut *self.handled.lock().unwrap_or_else(|e| e.into_inner()));
        if turns.is_empty() {
            return true;
        }
        if let Err(e) = self.vectors.sync().await {
            tracing::warn!(error = %e, turns = turns.len(), "could not flush the vector index; trying again");
            let mut handled = self.handled.lock().unwrap_or_else(|e| e.into_inner());
            let later = std::mem::replace(&mut *handled, turns);
            handled.extend(later);
            return false;
        }
        let raw = self.raw.clone();
        let marked = tokio::task::spawn_blocking(move || raw.mark_stored(&turns)).await;
        if let Err(e) = marked.unwrap_or_else(|joined| Err(joined.into())) {
            tracing::error!(error = %e, "could not clear pending marks; turns will be replayed at start");
        }
        self.stored.notify_waiters();
        true
    }

    /// Settles what the writer hands over, at most every [`SYNC_EVERY`] while it keeps
    /// writing, and as soon as its input is drained (the last turns of a burst need not wait
    /// for the next second), until shutdown.
    async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = shutdown.changed() => return,
            }
            if let Some(due) = last.map(|l| l + SYNC_EVERY) {
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => {}
                    _ = self.drained.notified() => {}
                    _ = shutdown.changed() => return,
                }
            }
            last = Some(tokio::time::Instant::now());
            if !self.settle().await {
                self.wake.notify_one();
            }
        }
    }
}

/// A stage whose batches hold the write gate (shared): a backup waits for the batch in hand
/// and holds the next one off until the copy is done.
struct Gated {
    inner: Arc<dyn Stage>,
    gate: Arc<tokio::sync::RwLock<()>>,
}

#[async_trait::async_trait]
impl Stage for Gated {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn input_topic(&self) -> &'static str {
        self.inner.input_topic()
    }
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
    fn idle(&self) {
        self.inner.idle();
    }
    async fn handle(
        &self,
        batch: &[recollect_bus::Delivery],
    ) -> Vec<Result<Vec<recollect_bus::Message>, recollect_bus::StageError>> {
        let _writing = self.gate.read().await;
        self.inner.handle(batch).await
    }
}

/// `POST /v1/admin/backup`, `recollect backup`: the data directory's stores copied while every
/// writer (store, edit, erase, the workers' batches) waits at the gate; recall goes on.
pub struct DataDirBackup {
    dir: std::path::PathBuf,
    gate: Arc<tokio::sync::RwLock<()>>,
    graph: Arc<dyn Graph>,
    vectors: Arc<dyn VectorIndex>,
}

#[async_trait::async_trait]
impl recollect_gateway::Backup for DataDirBackup {
    async fn backup(&self, to: &Path) -> Result<recollect_gateway::BackupDone, RecollectError> {
        if !to.is_absolute() {
            return Err(RecollectError::invalid(format!(
                "path {:?} must be absolute (a directory on the server's machine)",
                to.display()
            )));
        }
        if to.starts_with(&self.dir) {
            return Err(RecollectError::invalid(format!(
                "path {:?} is inside the data directory",
                to.display()
            )));
        }
        if to.exists()
            && std::fs::read_dir(to)
                .map(|mut d| d.next().is_some())
                .unwrap_or(true)
        {
            return Err(RecollectError::invalid(format!(
                "path {:?} exists and is not an empty directory; nothing written",
                to.display()
            )));
        }
        let io = |e: std::io::Error| RecollectError::internal(format!("backup: {e}"));
        std::fs::create_dir_all(to).map_err(io)?;
        let _no_writes = self.gate.write().await;
        let paused = std::time::Instant::now();
        let mut not_included = Vec::new();
        let copy = |name: &str| -> Result<(), RecollectError> {
            std::fs::copy(self.dir.join(name), to.join(name))
                .map(drop)
                .map_err(io)
        };
        copy("raw.redb")?;
        if self.graph.kind() == "embedded" {
            copy("graph.redb")?;
        } else {
            not_included.push(format!("graph ({})", self.graph.kind()));
        }
        let copied = self
            .vectors
            .copy_files_to(&to.join("vectors"))
            .await
            .map_err(RecollectError::from_classified)?;
        if !copied {
            not_included.push(format!("vectors ({})", self.vectors.kind()));
        }
        let paused_ms = paused.elapsed().as_millis() as u64;
        drop(_no_writes);
        // Durable before the answer: every copied file synced.
        let bytes = sync_tree(to).map_err(io)?;
        Ok(recollect_gateway::BackupDone {
            path: to.display().to_string(),
            bytes,
            paused_ms,
            not_included,
        })
    }
}

/// fsyncs every file under `dir`; returns their total size.
fn sync_tree(dir: &Path) -> std::io::Result<u64> {
    let mut bytes = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            bytes += sync_tree(&e.path())?;
        } else {
            let f = std::fs::File::open(e.path())?;
            f.sync_all()?;
            bytes += f.metadata()?.len();
        }
    }
    std::fs::File::open(dir)?.sync_all()?;
    Ok(bytes)
}

/// What recall keeps by question text: the sentence encoder's vectors (the question's and its
/// keywords') and the late model's token vectors of the question.
#[derive(Clone)]
pub struct QueryCaches {
    pub embeddings: Arc<CachedEmbedder<Arc<dyn Embedder>>>,
    pub tokens: Option<Arc<CachedTokenEmbedder<Arc<dyn TokenEmbedder>>>>,
}

impl QueryCaches {
    /// Empties both.
    pub fn clear(&self) {
        self.embeddings.clear();
        if let Some(tokens) = &self.tokens {
            tokens.clear();
        }
    }

    /// The token model as recall reads it: through the cache.
    fn token_embedder(&self) -> Option<Arc<dyn TokenEmbedder>> {
        self.tokens.clone().map(|t| t as Arc<dyn TokenEmbedder>)
    }
}

struct EmbeddedEraser {
    raw: RawStore,
    gate: Arc<tokio::sync::RwLock<()>>,
    graph: Arc<dyn Graph>,
    vectors: Arc<dyn VectorIndex>,
    /// Emptied on every erasure, since a tenant's queries may quote what was erased.
    query_caches: QueryCaches,
}

#[async_trait::async_trait]
impl Eraser for EmbeddedEraser {
    async fn erase_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<Option<u64>, RecollectError> {
        // Not taken by erase_tenant around this: a second shared hold behind a waiting backup
        // would deadlock.
        let _writing = self.gate.read().await;
        // The marker first, durably: from here on no stage writes a turn of this conversation
        // recorded until now, however far along the pipeline it is.
        self.graph
            .record_erasure(tenant, Some(conversation), chrono::Utc::now())
            .await
            .map_err(RecollectError::from_classified)?;
        let raw = self.raw.clone();
        let (t, c) = (tenant.clone(), conversation.to_string());
        let known_raw = raw
            .conversation_exists(&t, &c)
            .map_err(RecollectError::from_classified)?;
        let known_graph = self
            .graph
            .conversations(tenant)
            .await
            .map_err(RecollectError::from_classified)?
            .contains(&c);
        if !known_raw && !known_graph {
            return Ok(None);
        }
        // Derived stores, then the raw turns: a crash part-way leaves the raw turns, and the
        // erase can simply be repeated (replayed turns are dropped by the marker).
        self.vectors
            .delete_conversation(tenant, conversation)
            .await
            .map_err(RecollectError::from_classified)?;
        self.graph
            .delete_conversation(tenant, conversation)
            .await
            .map_err(RecollectError::from_classified)?;
        let n = tokio::task::spawn_blocking(move || raw.delete_conversation(&t, &c))
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
        self.query_caches.clear();
        tracing::info!(turns = n, "conversation erased");
        Ok(Some(n))
    }

    async fn erase_memory(
        &self,
        tenant: &TenantId,
        id: MemoryId,
    ) -> Result<Option<Turn>, RecollectError> {
        let _writing = self.gate.read().await;
        let raw = self.raw.clone();
        let in_raw = tokio::task::spawn_blocking(move || raw.get(id))
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?
            .filter(|t| t.tenant == *tenant);
        let turn = match in_raw {
            Some(t) => t,
            None => match recollect_gateway::graph_turn(self.graph.as_ref(), tenant, id).await? {
                Some(t) => t,
                None => return Ok(None),
            },
        };
        // Derived stores, then the raw turn: a crash part-way leaves the raw turn, and the
        // delete can be repeated (the erasure record drops the turn if it is replayed).
        recollect_gateway::erase_turn_in_stores(
            self.graph.as_ref(),
            self.vectors.as_ref(),
            tenant,
            &turn,
        )
        .await?;
        let (raw, t) = (self.raw.clone(), tenant.clone());
        tokio::task::spawn_blocking(move || raw.delete_turn(&t, id))
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
        self.query_caches.clear();
        Ok(Some(turn))
    }

    async fn erase_tenant(&self, tenant: &TenantId) -> Result<(u64, u64), RecollectError> {
        // Covers the tenant's turns still in the pipeline, in conversations not yet stored too.
        self.graph
            .record_erasure(tenant, None, chrono::Utc::now())
            .await
            .map_err(RecollectError::from_classified)?;
        let raw = self.raw.clone();
        let t = tenant.clone();
        let mut conversations = tokio::task::spawn_blocking(move || raw.conversations(&t))
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
        conversations.extend(
            self.graph
                .conversations(tenant)
                .await
                .map_err(RecollectError::from_classified)?,
        );
        conversations.sort();
        conversations.dedup();
        let (mut convs, mut turns) = (0, 0);
        for c in &conversations {
            if let Some(n) = self.erase_conversation(tenant, c).await? {
                convs += 1;
                turns += n;
            }
        }
        // Every vector point carries its conversation, so the loop above removed them all, but
        // a graph-writer batch that read the markers before they existed may write its points
        // after the deletes: it re-reads the markers after writing and removes them itself, so
        // wait for that a little. Say so loudly if a point outlives it.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let left = loop {
            let left = self
                .vectors
                .count(tenant, &recollect_storage::Scope::all())
                .await
                .map_err(RecollectError::from_classified)?;
            if left == 0 || tokio::time::Instant::now() >= deadline {
                break left;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        if left > 0 {
            tracing::error!(points = left, "vector points left after a tenant erase");
            return Err(RecollectError::internal(format!(
                "{left} vector points left after erasing the tenant; retry the erase"
            )));
        }
        self.query_caches.clear();
        tracing::info!(conversations = convs, turns, "tenant erased");
        Ok((convs, turns))
    }
}

pub fn load_embedder(settings: &Settings) -> anyhow::Result<Arc<dyn Embedder>> {
    Ok(recollect_runtime::load_embedder(settings)?)
}

impl App {
    pub async fn open(settings: Settings) -> anyhow::Result<Self> {
        let embedder = load_embedder(&settings)?;
        Self::open_with(settings, embedder).await
    }

    /// [`Self::open`] with this sentence encoder, and the late-interaction model the settings
    /// name. Under `auto`, only beside a real sentence encoder: not with the hash embedder
    /// tests and load runs pass in.
    pub async fn open_with(
        settings: Settings,
        embedder: Arc<dyn Embedder>,
    ) -> anyhow::Result<Self> {
        let tokens = if settings.late_is_auto() && embedder.runtime() == "builtin" {
            None
        } else {
            recollect_runtime::load_token_embedder(&settings)?
        };
        Self::open_with_models(settings, embedder, tokens).await
    }

    /// [`Self::open_with`] with this late-interaction model (one for the turns' token vectors
    /// and the questions'; none: off).
    pub async fn open_with_models(
        settings: Settings,
        embedder: Arc<dyn Embedder>,
        tokens: Option<Arc<dyn TokenEmbedder>>,
    ) -> anyhow::Result<Self> {
        recollect_telemetry::register_all();
        let extractor = recollect_llm::extractor_from(&settings)?;
        let dir = settings.storage.data_dir.clone();
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating data dir {}", dir.display()))?;
        let raw = RawStore::open(&dir.join("raw.redb")).map_err(locked(&dir))?;
        let graph = open_graph(&settings, &dir).await.map_err(locked(&dir))?;
        // Under `auto`, a new index is made with room for token vectors only beside a model.
        let mut settings = settings;
        if settings.late_is_auto() && tokens.is_none() {
            settings.embedder.late_model.clear();
        }
        // Flushed by the graph writer's hook, once for several batches (`EmbeddedHooks`).
        let vectors = open_vectors_with(&settings, &dir, embedder.dim(), Flushes::OnSync)
            .await
            .context("opening the vector index")?;
        let tokens = recollect_runtime::token_embedder_for(&settings, tokens, vectors.as_ref());
        for (seam, kind) in [
            ("graph", graph.kind()),
            ("vectors", vectors.kind()),
            ("bus", "in_process"),
            ("embedder", embedder.model_name()),
            ("extractor", extractor.name()),
        ] {
            ComponentSelected { seam, kind }.emit();
        }
        let bus = InProcessBus::new(4096);
        bus.ensure_topics(&topics::ALL).await?;
        let stored = Arc::new(Notify::new());
        let hooks = Arc::new(EmbeddedHooks {
            bus: bus.clone(),
            raw: raw.clone(),
            vectors: vectors.clone(),
            stored: stored.clone(),
            handled: Default::default(),
            wake: Notify::new(),
            drained: Notify::new(),
        });
        let query_caches = QueryCaches {
            embeddings: Arc::new(CachedEmbedder::new(embedder.clone())),
            tokens: tokens
                .clone()
                .map(|t| Arc::new(CachedTokenEmbedder::new(t))),
        };
        let query_embedder: Arc<dyn Embedder> = query_caches.embeddings.clone();
        let consolidator =
            ConsolidatorStage::from_settings(graph.clone(), vectors.clone(), &settings)?;
        // Words of context kept and carried only where a late-interaction model reads them.
        let context_words = tokens
            .as_ref()
            .map_or(0, |_| settings.embedder.late_context_words);
        let stages: Vec<Arc<dyn Stage>> = vec![
            Arc::new(
                ExtractorStage::new(extractor.clone(), graph.clone())
                    .with_context_words(context_words),
            ),
            Arc::new(
                EmbedderStage::new(embedder.clone())
                    .with_token_embedder(tokens.clone())
                    .with_token_pooling(settings.embedder.late_pool_factor)
                    .with_context_words(context_words)
                    .with_erasures(graph.clone()),
            ),
            Arc::new(GraphWriterStage::new(
                graph.clone(),
                vectors.clone(),
                Some(hooks.clone()),
            )),
            Arc::new(consolidator),
        ];
        let gate = Arc::new(tokio::sync::RwLock::new(()));
        let stages: Vec<Arc<dyn Stage>> = stages
            .into_iter()
            .map(|inner| {
                Arc::new(Gated {
                    inner,
                    gate: gate.clone(),
                }) as Arc<dyn Stage>
            })
            .collect();
        let (shutdown, rx) = watch::channel(false);
        let bus_dyn: Arc<dyn Bus> = bus.clone();
        let handles = stages
            .into_iter()
            .map(|s| {
                tokio::spawn(run_stage(
                    bus_dyn.clone(),
                    s,
                    settings.bus.group_prefix.clone(),
                    rx.clone(),
                ))
            })
            .collect();
        let settling = tokio::spawn(hooks.clone().run(rx.clone()));
        let limits = Limits {
            max_turns_per_request: settings.server.max_turns_per_request,
            max_text_bytes: settings.server.max_text_bytes,
            wait_timeout: std::time::Duration::from_secs(settings.server.wait_timeout_secs),
        };
        let gateway = Arc::new(
            Gateway::new(raw.clone(), bus_dyn, limits, stored)
                .with_graph(graph.clone())
                .with_gate(gate.clone()),
        );
        let recall = Arc::new(
            Recall::new(
                graph.clone(),
                vectors.clone(),
                query_embedder,
                settings.recall.clone(),
                RecallLimits::from(&settings.server),
            )
            .with_reranker(recollect_runtime::load_reranker(&settings)?)
            .with_token_embedder(query_caches.token_embedder()),
        );
        let backup = Arc::new(DataDirBackup {
            dir: dir.clone(),
            gate: gate.clone(),
            graph: graph.clone(),
            vectors: vectors.clone(),
        });
        let eraser = Arc::new(EmbeddedEraser {
            raw: raw.clone(),
            gate,
            graph: graph.clone(),
            vectors: vectors.clone(),
            query_caches: query_caches.clone(),
        });
        let app = Self {
            settings,
            raw,
            graph,
            vectors,
            embedder,
            gateway,
            recall,
            eraser,
            backup,
            query_caches,
            shutdown,
            stages: handles,
            hooks,
            settling,
        };
        let replayed = app.gateway.replay_pending().await?;
        if replayed > 0 {
            tracing::info!(
                turns = replayed,
                "resuming enrichment of turns left unfinished"
            );
        }
        Ok(app)
    }

    /// Waits until every stored turn is enriched (bulk loads: no request-sized timeout).
    pub async fn wait_enriched(&self) -> anyhow::Result<()> {
        loop {
            // Listening before counting: marks cleared in between still wake this.
            let settled = self.hooks.stored.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let raw = self.raw.clone();
            let pending = tokio::task::spawn_blocking(move || raw.pending_count()).await??;
            if pending == 0 {
                return Ok(());
            }
            // A turn replayed or cleared elsewhere wakes nobody: count again after a while too.
            tokio::select! {
                _ = settled => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
            }
        }
    }

    /// Stops the workers after they finish the batch in hand.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for h in self.stages {
            let _ = h.await;
        }
        // The writer's last batches, so a clean stop leaves nothing to replay.
        let _ = self.settling.await;
        self.hooks.settle().await;
    }
}

fn locked(dir: &Path) -> impl Fn(recollect_storage::StoreError) -> anyhow::Error + '_ {
    move |e| {
        anyhow::anyhow!(
            "{e}: is another recollect process using {}? Stop it, or talk to it with --server",
            dir.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use recollect_embed::HashEmbedder;
    use recollect_gateway::StoreRequest;
    use recollect_model::{TenantId, TurnInput};
    use recollect_recall::RecallRequest;

    use super::*;

    fn turns(conversation: usize, n: usize) -> Vec<TurnInput> {
        (0..n)
            .map(|i| TurnInput {
                turn_id: Some(format!("{conversation}-{i}")),
                user: format!("I walked my dog Rex to park {i} in town {conversation}"),
                assistant: Some(format!("Walk {i} noted")),
                user_speaker: None,
                assistant_speaker: None,
                timestamp: chrono::Utc::now(),
                metadata: Default::default(),
                user_id: None,
                agent_id: None,
            })
            .collect()
    }

    /// The writer's "drained" settles at once only at a burst's end: while a stage before it
    /// still has turns waiting, the writer merely caught up, and the flush waits for its second.
    #[tokio::test]
    async fn the_writer_settles_at_once_only_when_the_stages_before_it_are_drained() {
        let dir = tempfile::tempdir().unwrap();
        let bus = InProcessBus::new(16);
        bus.ensure_topics(&topics::ALL).await.unwrap();
        let hooks = EmbeddedHooks {
            raw: RawStore::open(&dir.path().join("raw.redb")).unwrap(),
            vectors: Arc::new(
                recollect_storage::EdgeVectorIndex::open(&dir.path().join("vectors"), 4).unwrap(),
            ),
            stored: Default::default(),
            handled: Default::default(),
            wake: Notify::new(),
            drained: Notify::new(),
            bus: bus.clone(),
        };
        async fn settles_now(h: &EmbeddedHooks) -> bool {
            let told = h.drained.notified();
            tokio::time::timeout(std::time::Duration::from_millis(20), told)
                .await
                .is_ok()
        }
        hooks.idle();
        assert!(
            !settles_now(&hooks).await,
            "nothing handled, nothing to settle"
        );
        hooks.stored(&[(MemoryId::nil(), chrono::Utc::now())]);
        for topic in [topics::RAW, topics::EXTRACTED, topics::EMBEDDED] {
            bus.publish(vec![recollect_bus::Message::json(
                topic,
                "k".into(),
                1,
                "t",
            )])
            .await
            .unwrap();
            hooks.idle();
            assert!(!settles_now(&hooks).await, "a turn waits in {topic}");
            let mut sub = bus.subscribe(topic, "g").await.unwrap();
            let taken = sub
                .poll(8, std::time::Duration::from_secs(1))
                .await
                .unwrap();
            assert_eq!(taken.len(), 1);
        }
        hooks.idle();
        assert!(settles_now(&hooks).await, "every stage drained: settle now");
    }

    /// With the vector index flushed for several writer batches at once, a turn stored with
    /// `wait` is still answered once recallable, and a clean stop leaves nothing to replay
    /// (the writer's last turns are settled at shutdown).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_group_flushes_a_waited_turn_is_recallable_and_a_clean_stop_leaves_none_pending() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::defaults();
        settings.storage.data_dir = dir.path().to_path_buf();
        let tenant = TenantId("t".into());
        {
            let app = App::open_with(settings.clone(), Arc::new(HashEmbedder::default()))
                .await
                .unwrap();
            // Many small requests: the writer's batches come faster than `SYNC_EVERY`.
            for c in 0..40 {
                let req = StoreRequest {
                    turns: turns(c, 5),
                    wait: Some(false),
                };
                app.gateway
                    .store(&tenant, &format!("c{c}"), req, "test")
                    .await
                    .unwrap();
            }
            let waited = StoreRequest {
                turns: turns(99, 1),
                wait: Some(true),
            };
            let started = std::time::Instant::now();
            app.gateway
                .store(&tenant, "c99", waited, "test")
                .await
                .unwrap();
            assert!(started.elapsed() < std::time::Duration::from_secs(10));
            let req = RecallRequest {
                query: "Rex park 0".into(),
                conversation_ids: Some(vec!["c99".into()]),
                ..Default::default()
            };
            let got = app.recall.recall(&tenant, &req).await.unwrap();
            assert_eq!(got.len(), 1, "{got:?}");
            app.wait_enriched().await.unwrap();
            app.shutdown().await;
        }
        let raw = RawStore::open(&dir.path().join("raw.redb")).unwrap();
        assert_eq!(
            raw.pending_count().unwrap(),
            0,
            "a clean stop replays nothing"
        );
    }

    /// Path C (fragment expansion) is off by default and finds turns once `recall.path_c` is
    /// on, over the same store: the fragments are built either way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn path_c_runs_only_when_switched_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::defaults();
        settings.storage.data_dir = dir.path().to_path_buf();
        assert!(!settings.recall.path_c);
        let tenant = TenantId("t".into());
        let app = App::open_with(settings, Arc::new(HashEmbedder::default()))
            .await
            .unwrap();
        let req = StoreRequest {
            turns: turns(1, 12),
            wait: Some(true),
        };
        app.gateway.store(&tenant, "c1", req, "test").await.unwrap();
        app.wait_enriched().await.unwrap();
        let query = RecallRequest {
            query: "Where did I walk my dog Rex?".into(),
            conversation_ids: Some(vec!["c1".into()]),
            ..Default::default()
        };
        let from_c = |got: &[recollect_model::RecalledMemory]| {
            got.iter()
                .filter(|m| m.sources.iter().any(|s| s == "C" || s == "BC"))
                .count()
        };
        let off = app.recall.recall(&tenant, &query).await.unwrap();
        assert!(!off.is_empty());
        assert_eq!(from_c(&off), 0, "{off:?}");
        let on = app.recall.with_config(recollect_recall::RecallConfig {
            path_c: true,
            ..app.recall.config().clone()
        });
        let on = on.recall(&tenant, &query).await.unwrap();
        assert!(from_c(&on) > 0, "{on:?}");
        app.shutdown().await;
    }

    /// Late interaction under `auto` (the default since 2026-11-30): a new data directory is
    /// made with room for token vectors and recall scores them; one made without them (late
    /// interaction off, the default before) opens, stores and recalls as it did.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn auto_late_interaction_takes_a_data_directory_made_without_it() {
        let mut settings = Settings::defaults();
        assert!(settings.late_is_auto());
        let Some(tokens) = recollect_runtime::load_token_embedder(&settings).unwrap() else {
            eprintln!(
                "SKIPPED: the late-interaction model or ONNX Runtime is not installed (make setup installs both)"
            );
            return;
        };
        let tenant = TenantId("t".into());
        let query = RecallRequest {
            query: "Where did I walk my dog Rex?".into(),
            conversation_ids: Some(vec!["c1".into()]),
            ..Default::default()
        };
        let store = |c| StoreRequest {
            turns: turns(c, 6),
            wait: Some(true),
        };
        let open = |s: Settings, tokens| async move {
            App::open_with_models(s, Arc::new(HashEmbedder::default()), tokens)
                .await
                .unwrap()
        };

        let fresh = tempfile::tempdir().unwrap();
        settings.storage.data_dir = fresh.path().to_path_buf();
        let app = open(settings.clone(), Some(tokens.clone())).await;
        app.gateway
            .store(&tenant, "c1", store(1), "test")
            .await
            .unwrap();
        app.wait_enriched().await.unwrap();
        let got = app.recall.recall(&tenant, &query).await.unwrap();
        assert!(!got.is_empty(), "{got:?}");
        assert!(got.iter().all(|m| m.score_parts.late.is_some()), "{got:?}");
        app.shutdown().await;

        let old = tempfile::tempdir().unwrap();
        settings.storage.data_dir = old.path().to_path_buf();
        let mut off = settings.clone();
        off.embedder.late_model.clear();
        let app = open(off, None).await;
        app.gateway
            .store(&tenant, "c1", store(1), "test")
            .await
            .unwrap();
        app.wait_enriched().await.unwrap();
        app.shutdown().await;
        let app = open(settings, Some(tokens)).await;
        app.gateway
            .store(&tenant, "c1", store(2), "test")
            .await
            .unwrap();
        app.wait_enriched().await.unwrap();
        let got = app.recall.recall(&tenant, &query).await.unwrap();
        assert_eq!(got.len(), 12, "{got:?}");
        assert!(got.iter().all(|m| m.score_parts.late.is_none()), "{got:?}");
        app.shutdown().await;
    }

    /// A repeated question's token vectors come from the cache, not the late model; an
    /// erasure empties it with the embeddings' cache (the question may quote what was erased).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeated_questions_token_vectors_are_cached_until_an_erasure() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::defaults();
        settings.storage.data_dir = dir.path().to_path_buf();
        // The index is made as wide as the configured model's token vectors: that model.
        let Some(tokens) = recollect_runtime::load_token_embedder(&settings).unwrap() else {
            eprintln!(
                "SKIPPED: the late-interaction model or ONNX Runtime is not installed (make setup installs both)"
            );
            return;
        };
        let app = App::open_with_models(settings, Arc::new(HashEmbedder::default()), Some(tokens))
            .await
            .unwrap();
        let tenant = TenantId("t".into());
        let store = StoreRequest {
            turns: turns(1, 4),
            wait: Some(true),
        };
        app.gateway
            .store(&tenant, "c1", store, "test")
            .await
            .unwrap();
        app.wait_enriched().await.unwrap();
        let query = RecallRequest {
            query: "Where did I walk my dog Rex?".into(),
            conversation_ids: Some(vec!["c1".into()]),
            ..Default::default()
        };
        let cache = app
            .query_caches
            .tokens
            .clone()
            .expect("late interaction on");
        let first = app.recall.recall(&tenant, &query).await.unwrap();
        assert!(
            first.iter().all(|m| m.score_parts.late.is_some()),
            "{first:?}"
        );
        assert_eq!((cache.stats().misses, cache.stats().hits), (1, 0));
        let again = app.recall.recall(&tenant, &query).await.unwrap();
        assert_eq!((cache.stats().misses, cache.stats().hits), (1, 1));
        let ids = |r: &[recollect_model::RecalledMemory]| {
            r.iter().map(|m| m.memory_id).collect::<Vec<_>>()
        };
        assert_eq!(ids(&again), ids(&first), "the cached vectors rank the same");

        app.eraser.erase_conversation(&tenant, "c1").await.unwrap();
        assert_eq!(cache.stats().len, 0, "emptied by the erasure");
        assert_eq!(app.query_caches.embeddings.stats().len, 0);
        app.shutdown().await;
    }
}
