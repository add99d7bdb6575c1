//! Typed telemetry events, after the internal events of Vector (vectordotdev/vector,
//! `src/internal_events/`): a place that has something to report builds one of these structs and
//! calls [`InternalEvent::emit`], which writes one structured log line and updates the event's
//! metrics. Call sites never touch a metric; a family is fed by its events only, and its label
//! values come from the enums here (or from `&'static str` names fixed in the code, such as a
//! stage's name), so a family cannot pick up a value nobody declared.
//!
//! Log levels follow how often an event happens: trace for every store call, request and batch
//! (off unless asked for), debug for every message and accepted batch, warn for a retry, error
//! for a dead letter. None of them carries turn text, queries or keys.

use std::fmt::Display;
use std::time::Duration;

use crate::{
    COMPONENT_INFO, CONSUMER_LAG, EMBED_BATCH_SIZE, EMBED_LATENCY, GRPC_REQUESTS, HTTP_REQUESTS,
    HTTP_SHED, RECALL_CANDIDATES, RECALL_EMPTY, RECALL_LATENCY, RECALL_RERANKS, STAGE_BATCH_SIZE,
    STAGE_LATENCY, STAGE_MESSAGES, STAGE_RETRIES, STORE_ERRORS, STORE_READ_LATENCY,
    STORE_WRITE_LATENCY, TURNS_ACCEPTED, TURNS_REJECTED,
};

/// Something worth a log line and a metric update.
pub trait InternalEvent: Sized {
    fn emit(self);
}

const NO_LABELS: &[&str] = &[];

// ---------------------------------------------------------------------------------------------
// Gateway

/// Turns committed (embedded: to the raw store; distributed: acknowledged by the brokers).
#[derive(Debug, Clone, Copy)]
pub struct TurnsAccepted {
    pub count: usize,
}

impl InternalEvent for TurnsAccepted {
    fn emit(self) {
        tracing::debug!(turns = self.count, "turns accepted");
        TURNS_ACCEPTED
            .with_label_values(NO_LABELS)
            .inc_by(self.count as u64);
    }
}

/// A turn refused at the edge; `reason` is one of the rejection reasons of
/// `recollect_model::request` (empty_text, too_large, bad_timestamp, …).
#[derive(Debug, Clone, Copy)]
pub struct TurnRejected {
    pub reason: &'static str,
}

impl InternalEvent for TurnRejected {
    fn emit(self) {
        tracing::debug!(reason = self.reason, "turn rejected");
        TURNS_REJECTED.with_label_values(&[self.reason]).inc();
    }
}

// ---------------------------------------------------------------------------------------------
// Pipeline and bus

/// A stage handled one message and will publish what it produced.
#[derive(Debug, Clone, Copy)]
pub struct StageMessageProcessed<'a> {
    pub stage: &'static str,
    /// The request's trace id, from the gateway through every topic's headers.
    pub trace_id: &'a str,
    pub partition: i32,
    pub offset: i64,
}

impl InternalEvent for StageMessageProcessed<'_> {
    fn emit(self) {
        tracing::debug!(
            stage = self.stage,
            trace_id = self.trace_id,
            partition = self.partition,
            offset = self.offset,
            "processed"
        );
        STAGE_MESSAGES.with_label_values(&[self.stage, "ok"]).inc();
    }
}

/// A transient failure of one message, about to be retried.
#[derive(Clone, Copy)]
pub struct StageMessageRetried<'a> {
    pub stage: &'static str,
    pub error: &'a dyn Display,
}

impl InternalEvent for StageMessageRetried<'_> {
    fn emit(self) {
        tracing::warn!(stage = self.stage, error = %self.error, "retrying message");
        STAGE_RETRIES.with_label_values(&[self.stage]).inc();
    }
}

/// A message that failed for good (permanent, or out of retries), sent to `recollect.dlq`.
#[derive(Clone, Copy)]
pub struct StageMessageDeadLettered<'a> {
    pub stage: &'static str,
    pub trace_id: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub error: &'a dyn Display,
}

impl InternalEvent for StageMessageDeadLettered<'_> {
    fn emit(self) {
        tracing::error!(
            stage = self.stage,
            trace_id = self.trace_id,
            offset = self.offset,
            partition = self.partition,
            error = %self.error,
            "message dead-lettered"
        );
        STAGE_MESSAGES.with_label_values(&[self.stage, "dlq"]).inc();
    }
}

/// A batch handled, published and committed.
#[derive(Debug, Clone, Copy)]
pub struct StageBatchHandled {
    pub stage: &'static str,
    pub messages: usize,
    pub elapsed: Duration,
}

impl InternalEvent for StageBatchHandled {
    fn emit(self) {
        tracing::trace!(
            stage = self.stage,
            messages = self.messages,
            elapsed_ms = self.elapsed.as_secs_f64() * 1e3,
            "batch handled"
        );
        STAGE_LATENCY
            .with_label_values(&[self.stage])
            .observe(self.elapsed.as_secs_f64());
        STAGE_BATCH_SIZE
            .with_label_values(&[self.stage])
            .observe(self.messages as f64);
    }
}

/// Messages not yet consumed on a topic partition this process reads (queue depth in-process).
#[derive(Debug, Clone, Copy)]
pub struct ConsumerLagObserved<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub lag: i64,
}

impl InternalEvent for ConsumerLagObserved<'_> {
    fn emit(self) {
        tracing::trace!(
            topic = self.topic,
            partition = self.partition,
            lag = self.lag,
            "consumer lag"
        );
        CONSUMER_LAG
            .with_label_values(&[self.topic, &self.partition.to_string()])
            .set(self.lag);
    }
}

/// A partition this process no longer reads (moved to another member in a rebalance): its lag
/// is reported there now, so the series is dropped here rather than left at its last value.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerLagReleased<'a> {
    pub topic: &'a str,
    pub partition: i32,
}

impl InternalEvent for ConsumerLagReleased<'_> {
    fn emit(self) {
        tracing::debug!(
            topic = self.topic,
            partition = self.partition,
            "partition released"
        );
        let _ = CONSUMER_LAG.remove_label_values(&[self.topic, &self.partition.to_string()]);
    }
}

// ---------------------------------------------------------------------------------------------
// Stores

/// Which store seam a call went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seam {
    Graph,
    Vectors,
}

impl Seam {
    pub fn as_str(self) -> &'static str {
        match self {
            Seam::Graph => "graph",
            Seam::Vectors => "vectors",
        }
    }
}

/// The implementation behind a seam: the embedded graph (redb), the edge vector engine, Neo4j,
/// Qdrant, or a `recollect-store` service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreBackend {
    Embedded,
    Edge,
    Neo4j,
    Qdrant,
    Remote,
}

impl StoreBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreBackend::Embedded => "embedded",
            StoreBackend::Edge => "edge",
            StoreBackend::Neo4j => "neo4j",
            StoreBackend::Qdrant => "qdrant",
            StoreBackend::Remote => "remote",
        }
    }
}

/// A store operation: the method of the `Graph` or `VectorIndex` seam, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    // Graph writes.
    WriteTurns,
    WriteFragments,
    SaveConversationState,
    RecordErasure,
    AdvanceConsolidatedUntil,
    WriteConsolidation,
    RecordTurnErasure,
    PurgeErased,
    RestartDerivation,
    // Both seams.
    DeleteConversation,
    // Graph reads.
    Turns,
    ConversationTurns,
    Conversations,
    ConversationsAfter,
    KnownConversations,
    ConversationsOf,
    Vocabulary,
    LinkedTurns,
    DocumentFrequencies,
    Fragments,
    ConversationState,
    Erasures,
    // Vector writes.
    UpsertTurns,
    KeepVersions,
    UpsertKeywords,
    DeleteTurns,
    Optimize,
    Sync,
    // Vector reads.
    Search,
    FieldVectors,
    LateScores,
    SentenceScores,
    VersionVectors,
    SearchKeywords,
    Count,
    CopyFilesTo,
}

impl StoreOp {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::WriteTurns => "write_turns",
            StoreOp::WriteFragments => "write_fragments",
            StoreOp::SaveConversationState => "save_conversation_state",
            StoreOp::RecordErasure => "record_erasure",
            StoreOp::AdvanceConsolidatedUntil => "advance_consolidated_until",
            StoreOp::WriteConsolidation => "write_consolidation",
            StoreOp::RecordTurnErasure => "record_turn_erasure",
            StoreOp::PurgeErased => "purge_erased",
            StoreOp::RestartDerivation => "restart_derivation",
            StoreOp::DeleteConversation => "delete_conversation",
            StoreOp::Turns => "turns",
            StoreOp::ConversationTurns => "conversation_turns",
            StoreOp::Conversations => "conversations",
            StoreOp::ConversationsAfter => "conversations_after",
            StoreOp::KnownConversations => "known_conversations",
            StoreOp::ConversationsOf => "conversations_of",
            StoreOp::Vocabulary => "vocabulary",
            StoreOp::LinkedTurns => "linked_turns",
            StoreOp::DocumentFrequencies => "document_frequencies",
            StoreOp::Fragments => "fragments",
            StoreOp::ConversationState => "conversation_state",
            StoreOp::Erasures => "erasures",
            StoreOp::UpsertTurns => "upsert_turns",
            StoreOp::KeepVersions => "keep_versions",
            StoreOp::UpsertKeywords => "upsert_keywords",
            StoreOp::DeleteTurns => "delete_turns",
            StoreOp::Optimize => "optimize",
            StoreOp::Sync => "sync",
            StoreOp::Search => "search",
            StoreOp::FieldVectors => "field_vectors",
            StoreOp::LateScores => "late_scores",
            StoreOp::SentenceScores => "sentence_scores",
            StoreOp::VersionVectors => "version_vectors",
            StoreOp::SearchKeywords => "search_keywords",
            StoreOp::Count => "count",
            StoreOp::CopyFilesTo => "copy_files_to",
        }
    }

    /// Whether the operation changes the store (its latency goes to the write histogram).
    pub fn is_write(self) -> bool {
        matches!(
            self,
            StoreOp::WriteTurns
                | StoreOp::WriteFragments
                | StoreOp::SaveConversationState
                | StoreOp::RecordErasure
                | StoreOp::AdvanceConsolidatedUntil
                | StoreOp::WriteConsolidation
                | StoreOp::RecordTurnErasure
                | StoreOp::PurgeErased
                | StoreOp::RestartDerivation
                | StoreOp::DeleteConversation
                | StoreOp::UpsertTurns
                | StoreOp::KeepVersions
                | StoreOp::UpsertKeywords
                | StoreOp::DeleteTurns
                | StoreOp::Optimize
                | StoreOp::Sync
        )
    }
}

/// A store call that returned (successfully, or with an error that is the caller's).
#[derive(Debug, Clone, Copy)]
pub struct StoreCallCompleted {
    pub seam: Seam,
    pub backend: StoreBackend,
    pub op: StoreOp,
    pub elapsed: Duration,
}

impl InternalEvent for StoreCallCompleted {
    fn emit(self) {
        let labels = [self.seam.as_str(), self.backend.as_str(), self.op.as_str()];
        tracing::trace!(
            seam = labels[0],
            backend = labels[1],
            op = labels[2],
            elapsed_ms = self.elapsed.as_secs_f64() * 1e3,
            "store call"
        );
        let family = if self.op.is_write() {
            &STORE_WRITE_LATENCY
        } else {
            &STORE_READ_LATENCY
        };
        family
            .with_label_values(&labels)
            .observe(self.elapsed.as_secs_f64());
    }
}

/// A store call that failed in the store: unreachable, a backend error, unreadable data.
#[derive(Clone, Copy)]
pub struct StoreCallFailed<'a> {
    pub seam: Seam,
    pub backend: StoreBackend,
    pub op: StoreOp,
    pub error: &'a dyn Display,
}

impl InternalEvent for StoreCallFailed<'_> {
    fn emit(self) {
        let labels = [self.seam.as_str(), self.backend.as_str(), self.op.as_str()];
        // Debug, not warn: the caller decides (retry, dead letter, error response) and logs that.
        tracing::debug!(
            seam = labels[0],
            backend = labels[1],
            op = labels[2],
            error = %self.error,
            "store call failed"
        );
        STORE_ERRORS.with_label_values(&labels).inc();
    }
}

// ---------------------------------------------------------------------------------------------
// Recall

/// A phase of the recall pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecallPhase {
    Analyse,
    /// Phase 2's retrievers, each on its own (they overlap: Path C follows Path B, beside the
    /// dense and lexical retrievers).
    PathB,
    PathC,
    Dense,
    Lexical,
    /// The whole of Phase 2, all four retrievers.
    Retrieve,
    /// Phase 3: the candidates' records and vectors read, scored and fused.
    Rank,
    /// The cross-encoder re-reading the top results (`recall.rerank_model`).
    Rerank,
    /// Late interaction re-scoring the top results (`embedder.late_model`): the turns' MaxSim
    /// read (those the late retriever did not already score).
    Late,
    /// The late retriever (`recall.late_candidates`): the scope's turns scanned by MaxSim.
    LateScan,
}

impl RecallPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RecallPhase::Analyse => "analyse",
            RecallPhase::PathB => "path_b",
            RecallPhase::PathC => "path_c",
            RecallPhase::Dense => "dense",
            RecallPhase::Lexical => "lexical",
            RecallPhase::Retrieve => "retrieve",
            RecallPhase::Rank => "rank",
            RecallPhase::Rerank => "rerank",
            RecallPhase::Late => "late",
            RecallPhase::LateScan => "late_scan",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct RecallPhaseCompleted {
    pub phase: RecallPhase,
    pub elapsed: Duration,
}

impl InternalEvent for RecallPhaseCompleted {
    fn emit(self) {
        tracing::trace!(
            phase = self.phase.as_str(),
            elapsed_ms = self.elapsed.as_secs_f64() * 1e3,
            "recall phase"
        );
        RECALL_LATENCY
            .with_label_values(&[self.phase.as_str()])
            .observe(self.elapsed.as_secs_f64());
    }
}

/// What the cross-encoder did for one recall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RerankOutcome {
    /// It re-read the top results.
    Reread,
    /// The fused ranking's first result led the second by `recall.rerank_gap` or more: left
    /// as fused.
    Skipped,
    /// It failed; the fused ranking was served.
    Failed,
}

impl RerankOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RerankOutcome::Reread => "reread",
            RerankOutcome::Skipped => "skipped",
            RerankOutcome::Failed => "failed",
        }
    }
}

/// One recall's cross-encoder pass, whatever became of it.
#[derive(Debug, Clone, Copy)]
pub struct RecallReranked {
    pub outcome: RerankOutcome,
}

impl InternalEvent for RecallReranked {
    fn emit(self) {
        RECALL_RERANKS
            .with_label_values(&[self.outcome.as_str()])
            .inc();
    }
}

/// Candidate turns each retrieval path contributed to one recall.
#[derive(Debug, Clone, Copy)]
pub struct RecallCandidatesFound {
    /// Every turn Path B's lookups reached, before its intersection filter and its cap.
    pub reached: usize,
    pub path_b: usize,
    pub path_c: usize,
    pub dense: usize,
    pub lexical: usize,
    /// The late retriever's finds (`recall.late_candidates`; 0 where it did not run).
    pub late: usize,
}

impl InternalEvent for RecallCandidatesFound {
    fn emit(self) {
        tracing::trace!(
            reached = self.reached,
            path_b = self.path_b,
            path_c = self.path_c,
            dense = self.dense,
            lexical = self.lexical,
            late = self.late,
            "recall candidates"
        );
        for (path, n) in [
            ("reached", self.reached),
            ("path_b", self.path_b),
            ("path_c", self.path_c),
            ("dense", self.dense),
            ("lexical", self.lexical),
            ("late", self.late),
        ] {
            RECALL_CANDIDATES
                .with_label_values(&[path])
                .observe(n as f64);
        }
    }
}

/// One recall finished: its whole latency and how many memories it returned.
#[derive(Debug, Clone, Copy)]
pub struct RecallCompleted {
    pub results: usize,
    pub elapsed: Duration,
}

impl InternalEvent for RecallCompleted {
    fn emit(self) {
        tracing::debug!(
            results = self.results,
            elapsed_ms = self.elapsed.as_secs_f64() * 1e3,
            "recall done"
        );
        if self.results == 0 {
            RECALL_EMPTY.with_label_values(NO_LABELS).inc();
        }
        RECALL_LATENCY
            .with_label_values(&["total"])
            .observe(self.elapsed.as_secs_f64());
    }
}

/// The API a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Http,
    Grpc,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Http => "http",
            Api::Grpc => "grpc",
        }
    }
}

/// A recall as the client of an API saw it (auth, decoding and encoding included).
#[derive(Debug, Clone, Copy)]
pub struct RecallServed {
    pub api: Api,
    pub elapsed: Duration,
}

impl InternalEvent for RecallServed {
    fn emit(self) {
        tracing::trace!(
            api = self.api.as_str(),
            elapsed_ms = self.elapsed.as_secs_f64() * 1e3,
            "recall served"
        );
        RECALL_LATENCY
            .with_label_values(&[self.api.as_str()])
            .observe(self.elapsed.as_secs_f64());
    }
}

// ---------------------------------------------------------------------------------------------
// Embedder

/// One embedding batch of `texts` texts by `model`.
#[derive(Debug, Clone, Copy)]
pub struct EmbedderBatchCompleted<'a> {
    pub model: &'a str,
    pub texts: usize,
    pub elapsed: Duration,
}

impl InternalEvent for EmbedderBatchCompleted<'_> {
    fn emit(self) {
        tracing::trace!(
            model = self.model,
            texts = self.texts,
            elapsed_ms = self.elapsed.as_secs_f64() * 1e3,
            "embedding batch"
        );
        EMBED_BATCH_SIZE
            .with_label_values(&[self.model])
            .observe(self.texts as f64);
        EMBED_LATENCY
            .with_label_values(&[self.model])
            .observe(self.elapsed.as_secs_f64());
    }
}

// ---------------------------------------------------------------------------------------------
// Serving

/// An HTTP request answered; `route` is the matched route pattern (or "unmatched").
#[derive(Debug, Clone, Copy)]
pub struct HttpRequestCompleted<'a> {
    pub route: &'a str,
    pub status: u16,
}

impl InternalEvent for HttpRequestCompleted<'_> {
    fn emit(self) {
        tracing::trace!(route = self.route, status = self.status, "http request");
        let class = format!("{}xx", self.status / 100);
        HTTP_REQUESTS.with_label_values(&[self.route, &class]).inc();
    }
}

/// A gRPC call answered; `code` is "ok" or the status code in lower case.
#[derive(Debug, Clone, Copy)]
pub struct GrpcRequestCompleted<'a> {
    pub method: &'static str,
    pub code: &'a str,
}

impl InternalEvent for GrpcRequestCompleted<'_> {
    fn emit(self) {
        tracing::trace!(method = self.method, code = self.code, "grpc call");
        GRPC_REQUESTS
            .with_label_values(&[self.method, self.code])
            .inc();
    }
}

/// Why a request was turned away before any work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// The tenant's rate limit (429).
    RateLimited,
    /// The in-flight bound (503).
    Overloaded,
}

impl ShedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::RateLimited => "rate_limited",
            ShedReason::Overloaded => "overloaded",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct RequestShed {
    pub reason: ShedReason,
}

impl InternalEvent for RequestShed {
    fn emit(self) {
        tracing::debug!(reason = self.reason.as_str(), "request shed");
        HTTP_SHED.with_label_values(&[self.reason.as_str()]).inc();
    }
}

// ---------------------------------------------------------------------------------------------
// Process

/// Which implementation runs behind a seam (graph, vectors, bus, embedder, extractor) or which
/// service this process is (`seam` = service).
#[derive(Debug, Clone, Copy)]
pub struct ComponentSelected<'a> {
    pub seam: &'static str,
    pub kind: &'a str,
}

impl InternalEvent for ComponentSelected<'_> {
    fn emit(self) {
        tracing::debug!(seam = self.seam, kind = self.kind, "component");
        COMPONENT_INFO
            .with_label_values(&[self.seam, self.kind])
            .set(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render;

    /// The value of one series in the text exposition, e.g. `name{a="b"} 3`.
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    #[test]
    fn store_calls_land_in_the_write_or_read_family_by_operation() {
        let call = |op| StoreCallCompleted {
            seam: Seam::Vectors,
            backend: StoreBackend::Edge,
            op,
            elapsed: Duration::from_millis(2),
        };
        // The exposition sorts labels by name.
        let labels = |op: &str| format!("{{backend=\"edge\",op=\"{op}\",seam=\"vectors\"}}");
        let before = render();
        call(StoreOp::UpsertKeywords).emit();
        call(StoreOp::SearchKeywords).emit();
        StoreCallFailed {
            seam: Seam::Vectors,
            backend: StoreBackend::Edge,
            op: StoreOp::SearchKeywords,
            error: &"unreachable",
        }
        .emit();
        let after = render();
        let grew = |series: String| value(&after, &series) - value(&before, &series);
        assert_eq!(
            grew(format!(
                "recollect_store_write_duration_seconds_count{}",
                labels("upsert_keywords")
            )),
            1.0
        );
        assert_eq!(
            grew(format!(
                "recollect_store_read_duration_seconds_count{}",
                labels("search_keywords")
            )),
            1.0
        );
        assert_eq!(
            grew(format!(
                "recollect_store_write_duration_seconds_count{}",
                labels("search_keywords")
            )),
            0.0,
            "a read is not a write"
        );
        assert_eq!(
            grew(format!(
                "recollect_store_errors_total{}",
                labels("search_keywords")
            )),
            1.0
        );
    }

    #[test]
    fn a_recall_with_no_result_counts_as_empty_and_feeds_the_total() {
        let before = render();
        RecallCompleted {
            results: 0,
            elapsed: Duration::from_millis(3),
        }
        .emit();
        RecallCompleted {
            results: 4,
            elapsed: Duration::from_millis(3),
        }
        .emit();
        RecallCandidatesFound {
            reached: 5,
            path_b: 3,
            path_c: 0,
            dense: 10,
            lexical: 7,
            late: 4,
        }
        .emit();
        let after = render();
        let grew = |series: &str| value(&after, series) - value(&before, series);
        assert_eq!(grew("recollect_recall_empty_results_total"), 1.0);
        assert_eq!(
            grew("recollect_recall_duration_seconds_count{path=\"total\"}"),
            2.0
        );
        assert_eq!(
            grew("recollect_recall_candidates_turns_sum{path=\"dense\"}"),
            10.0
        );
        assert_eq!(
            grew("recollect_recall_candidates_turns_sum{path=\"late\"}"),
            4.0
        );
    }

    #[test]
    fn every_write_operation_is_a_graph_or_vector_method_that_changes_data() {
        let writes: Vec<&str> = [
            StoreOp::WriteTurns,
            StoreOp::DeleteConversation,
            StoreOp::UpsertTurns,
            StoreOp::Search,
            StoreOp::CopyFilesTo,
        ]
        .into_iter()
        .filter(|o| o.is_write())
        .map(StoreOp::as_str)
        .collect();
        assert_eq!(
            writes,
            ["write_turns", "delete_conversation", "upsert_turns"]
        );
    }
}
