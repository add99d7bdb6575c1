//! all-MiniLM-L6-v2 through ONNX Runtime against candle: the same vectors; its int8 form: close
//! vectors and the same rankings. Skipped (with a message) when `scripts/setup-onnx.sh` has not
//! run; `make test` runs it first.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use recollect_embed::{
    cosine, default_onnx_runtime_path, EmbedError, Embedder, MiniLmEmbedder, OnnxEmbedder,
    BGE_SMALL_EN_V15, MINILM_INT8, MODEL_DIR_ENV, ONNX_MODEL_FILE,
};

fn model_dir() -> PathBuf {
    match std::env::var_os(MODEL_DIR_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/all-MiniLM-L6-v2"),
    }
}

/// Both runtimes, or `None` (after saying so) when the ONNX side is not installed.
fn both() -> Option<&'static (OnnxEmbedder, MiniLmEmbedder)> {
    static BOTH: OnceLock<Option<(OnnxEmbedder, MiniLmEmbedder)>> = OnceLock::new();
    BOTH.get_or_init(|| {
        let dir = model_dir();
        let lib = default_onnx_runtime_path();
        if !dir.join(ONNX_MODEL_FILE).is_file() || !lib.is_file() {
            eprintln!(
                "SKIPPED: no {} in {} or no {} (run scripts/setup-onnx.sh)",
                ONNX_MODEL_FILE,
                dir.display(),
                lib.display()
            );
            return None;
        }
        Some((
            OnnxEmbedder::load(&dir, &lib)
                .expect("ONNX model and runtime present but fail to load"),
            MiniLmEmbedder::load(&dir).expect("model directory fails to load"),
        ))
    })
    .as_ref()
}

/// The int8 graph, or `None` (after saying so) when it is not installed.
fn int8() -> Option<&'static OnnxEmbedder> {
    static INT8: OnceLock<Option<OnnxEmbedder>> = OnceLock::new();
    INT8.get_or_init(|| {
        let dir = model_dir();
        let graph = MINILM_INT8.onnx_graph.unwrap();
        if !dir.join(graph).is_file() || !default_onnx_runtime_path().is_file() {
            eprintln!(
                "SKIPPED: no {graph} in {} (run scripts/setup-onnx.sh)",
                dir.display()
            );
            return None;
        }
        Some(
            OnnxEmbedder::load_model(&dir, &default_onnx_runtime_path(), &MINILM_INT8)
                .expect("int8 graph present but fails to load"),
        )
    })
    .as_ref()
}

const TEXTS: &[&str] = &[
    "hello world",
    "I adopted a puppy last week",
    "Where did Melanie go camping with her kids?",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful, the stories \
     people shared about their transitions gave me a lot of courage to keep going.",
    "",
    "Ok",
    "Melanie: We went camping at the beach last summer, roasted marshmallows and told stories \
     around the fire; the kids loved the stars.",
];

#[test]
fn onnx_gives_candles_vectors_one_at_a_time_and_batched() {
    let Some((onnx, candle)) = both() else { return };
    assert_eq!(
        onnx.model_name(),
        candle.model_name(),
        "same model, same name"
    );
    assert_eq!(onnx.dim(), candle.dim());
    let want = candle.embed(TEXTS).unwrap();
    let batched = onnx.embed(TEXTS).unwrap();
    for (i, text) in TEXTS.iter().enumerate() {
        let single = onnx.embed(&[text]).unwrap().remove(0);
        for (how, got) in [("alone", &single), ("batched", &batched[i])] {
            let c = cosine(got, &want[i]);
            assert!(c > 0.99999, "{text:?} {how}: cosine {c} to candle's");
            let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "{text:?} {how}: norm {norm}");
        }
    }
    assert!(onnx.embed(&[]).unwrap().is_empty());
}

#[test]
fn concurrent_callers_get_the_same_vectors() {
    let Some((onnx, _)) = both() else { return };
    let want = onnx.embed(TEXTS).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..5)
                        .map(|_| onnx.embed(TEXTS).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for got in h.join().unwrap() {
                for (g, w) in got.iter().zip(&want) {
                    assert!(cosine(g, w) > 0.999999);
                }
            }
        }
    });
}

#[test]
fn a_directory_without_the_graph_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = OnnxEmbedder::load(dir.path(), &default_onnx_runtime_path()).unwrap_err();
    assert!(
        matches!(&err, EmbedError::ModelNotFound { path } if path.ends_with(ONNX_MODEL_FILE)),
        "{err}"
    );
}

#[test]
fn int8_vectors_stay_close_to_f32_and_rank_the_same() {
    let (Some((_, candle)), Some(int8)) = (both(), int8()) else {
        return;
    };
    assert_eq!(
        int8.model_name(),
        "all-MiniLM-L6-v2-int8",
        "a model of its own"
    );
    assert_eq!(int8.dim(), candle.dim());
    let want = candle.embed(TEXTS).unwrap();
    let batched = int8.embed(TEXTS).unwrap();
    for (i, text) in TEXTS.iter().enumerate() {
        let single = int8.embed(&[text]).unwrap().remove(0);
        // The graph quantises activations with one scale per pass, so each text runs alone:
        // sent with others, it gets its own vector, bit for bit.
        assert_eq!(batched[i], single, "{text:?}: batch-mates moved its vector");
        let floor = common::int8_tolerance(0.99, 0.98);
        for (how, got) in [("alone", &single), ("batched", &batched[i])] {
            let c = cosine(got, &want[i]);
            assert!(c > floor, "{text:?} {how}: cosine {c} to f32");
            let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "{text:?} {how}: norm {norm}");
        }
    }
    // Each question finds its own turn first, as with f32.
    let turns = [
        "We adopted a beagle puppy and named him Biscuit.",
        "I finally got the job at the hospital, I start in March.",
        "Next summer we want to go to Lisbon and maybe Porto.",
        "My knee gave out at mile eighteen, so I did not finish the marathon.",
    ];
    let questions = [
        "What is the name of their dog?",
        "Where does she work now?",
        "Where are they travelling next summer?",
        "Did he finish the race?",
    ];
    let docs = int8.embed(&turns).unwrap();
    for (q, want_best) in questions.iter().zip(0..) {
        let v = int8.embed_queries(&[q]).unwrap().remove(0);
        let best = (0..docs.len())
            .max_by(|&a, &b| cosine(&v, &docs[a]).total_cmp(&cosine(&v, &docs[b])))
            .unwrap();
        assert_eq!(best, want_best, "{q:?} ranked {:?} first", turns[best]);
    }
}

#[test]
fn a_model_without_a_graph_is_a_clear_error() {
    let err = OnnxEmbedder::load_model(
        &model_dir(),
        &default_onnx_runtime_path(),
        &BGE_SMALL_EN_V15,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("no ONNX graph") && err.contains("candle"),
        "{err}"
    );
}
