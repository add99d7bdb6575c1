//! The cross-encoder (`recall.rerank_model`) against reference logits
//! (tests/fixtures/ms_marco_reference.json: each question–passage pair run alone, unpadded,
//! through ONNX Runtime's Python API with Hugging Face tokenizers' pair encoding). Here the
//! pairs run batched and padded, split over the sessions, so the test checks the pair encoding
//! (segment ids), the padding mask and the batching. Skipped (with a message) when the model is
//! not installed (`scripts/setup-model.sh ms-marco-MiniLM-L-12-v2-int8`).

use std::path::PathBuf;

use recollect_embed::{
    default_onnx_runtime_path, OnnxCrossEncoder, Reranker, RerankerSpec, MS_MARCO_MINILM_L12_INT8,
};

fn installed(spec: &RerankerSpec) -> Option<PathBuf> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let cache = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/recollect/models"));
    let found = [Some(repo), cache]
        .into_iter()
        .flatten()
        .map(|d| d.join(spec.dir))
        .find(|d| d.join("model.onnx").is_file());
    let lib = default_onnx_runtime_path();
    if found.is_none() || !lib.is_file() {
        eprintln!(
            "SKIPPED: {} or ONNX Runtime is not installed (scripts/setup-model.sh {}; scripts/setup-onnx.sh)",
            spec.name, spec.name
        );
        return None;
    }
    found
}

#[test]
fn ms_marco_cross_encoder_matches_the_reference_logits_batched() {
    let Some(dir) = installed(&MS_MARCO_MINILM_L12_INT8) else {
        return;
    };
    let model = OnnxCrossEncoder::load(
        &dir,
        &default_onnx_runtime_path(),
        &MS_MARCO_MINILM_L12_INT8,
    )
    .expect("installed graph loads");
    assert_eq!(model.model_name(), "ms-marco-MiniLM-L-12-v2-int8");
    let raw: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/ms_marco_reference.json")).unwrap();
    for case in raw["cases"].as_array().unwrap() {
        let question = case["question"].as_str().unwrap();
        let passages: Vec<&str> = case["passages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        let want: Vec<f32> = case["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        // One pair at a time, as the reference ran: the same logits.
        for (p, w) in passages.iter().zip(&want) {
            let alone = model.score(question, &[p]).unwrap();
            assert!(
                (alone[0] - w).abs() < 1e-3,
                "{question:?} / {p:?}: got {alone:?}, reference {w}"
            );
        }
        // Batched and padded: the graph quantises activations to int8 with one scale per
        // batch, so a pair's neighbours move its logit a little (0.34 at most here, as in
        // ONNX Runtime's Python API), never the order.
        let got = model.score(question, &passages).unwrap();
        assert_eq!(got.len(), passages.len());
        for ((g, w), p) in got.iter().zip(&want).zip(&passages) {
            assert!(
                (g - w).abs() < 0.5,
                "{question:?} / {p:?}: got {g}, reference {w}"
            );
        }
        // The passage that answers comes first, as in the reference.
        let best = |v: &[f32]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
        assert_eq!(best(&got), best(&want), "{question:?}");
        assert_eq!(best(&got), 0, "{question:?}: the answering passage wins");
    }
    assert!(model.score("anything", &[]).unwrap().is_empty());
}
