//! `recollect eval locomo` and the reference tool (../shared/tools/locomo_baseline.py) must print
//! the same figures for the same rankings, to the third decimal.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};

fn tool() -> Option<PathBuf> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/tools/locomo_baseline.py"
    ));
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} not found (it comes with ../shared)",
            p.display()
        );
        None
    }
}

/// A small conversation in LoCoMo's format, with the data's quirks: packed and padded evidence,
/// an odd session, an image caption, a dangling id.
fn sample(id: &str, topic: &str) -> Value {
    let mut conv = json!({"speaker_a": "Ann", "speaker_b": "Bob"});
    let mut qa = Vec::new();
    for s in 1..=3 {
        let n = if s == 2 { 5 } else { 6 };
        let turns: Vec<Value> = (1..=n)
            .map(|t| {
                let mut u = json!({"speaker": if t % 2 == 1 { "Ann" } else { "Bob" }, "dia_id": format!("D{s}:{t}"),
                    "text": format!("Session {s} line {t}: we talked about {topic} number {} and the {} trip.", s * 10 + t, ["lake", "city", "forest"][t % 3])});
                if t == 3 {
                    u["blip_caption"] = json!(format!("a photo of a {topic}"));
                }
                u
            })
            .collect();
        conv[format!("session_{s}")] = json!(turns);
        conv[format!("session_{s}_date_time")] = json!(format!("1:5{s} pm on {} May, 2023", s + 7));
    }
    for (i, (q, ev, cat)) in [
        (format!("What about {topic} number 12?"), json!(["D1:2"]), 4),
        (
            format!("When was the lake trip with {topic} 25?"),
            json!(["D2:5; D3:1"]),
            2,
        ),
        (
            "Which forest trip came up?".to_string(),
            json!(["D:3:03", "D9:9"]),
            1,
        ),
        (
            "Would Ann like cities?".to_string(),
            json!(["D1:1 D2:2"]),
            3,
        ),
        ("Did they discuss mars?".to_string(), json!(["D3:6"]), 5),
        ("Nothing valid here".to_string(), json!(["D"]), 4),
    ]
    .into_iter()
    .enumerate()
    {
        let _ = i;
        qa.push(json!({"question": q, "answer": "x", "evidence": ev, "category": cat}));
    }
    json!({"sample_id": id, "conversation": conv, "qa": qa})
}

/// Two small conversations written to `dir/mini.json`.
fn mini_data(dir: &std::path::Path) -> PathBuf {
    let data = dir.join("mini.json");
    let conversations = json!([sample("conv-a", "kayaks"), sample("conv-b", "violins")]);
    std::fs::write(&data, serde_json::to_vec(&conversations).unwrap()).unwrap();
    data
}

/// `recollect eval locomo --data DATA ARGS…` with the hash embedder; its stdout, once it succeeded.
fn eval(data: &std::path::Path, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(recollect_tests::binary())
        .args(["eval", "locomo", "--data"])
        .arg(data)
        .args(args)
        .env("RECOLLECT__EMBEDDER__KIND", "hash")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "eval failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn rows(out: &str) -> Vec<(String, Vec<f64>)> {
    out.lines()
        .filter_map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            let label_len = if parts
                .first()
                .is_some_and(|p| p.chars().all(|c| c.is_ascii_digit()))
                && parts.len() > 8
            {
                2
            } else {
                1
            };
            if parts.len() < label_len + 7 {
                return None;
            }
            let nums: Option<Vec<f64>> = parts[label_len..]
                .iter()
                .map(|p| p.parse::<f64>().ok())
                .collect();
            nums.map(|n| (parts[..label_len].join(" "), n))
        })
        .collect()
}

#[test]
fn eval_agrees_with_the_reference_tool() {
    let Some(tool) = tool() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = mini_data(dir.path());
    let rankings = dir.path().join("rankings.json");
    let ours = eval(&data, &["--dump-rankings".as_ref(), rankings.as_os_str()]);
    let theirs = Command::new("python3")
        .arg(&tool)
        .arg(&data)
        .arg("--score-rankings")
        .arg(&rankings)
        .output()
        .unwrap();
    assert!(
        theirs.status.success(),
        "{}",
        String::from_utf8_lossy(&theirs.stderr)
    );
    let theirs = String::from_utf8_lossy(&theirs.stdout).to_string();
    let (a, b) = (rows(&ours), rows(&theirs));
    assert!(!b.is_empty(), "reference printed no rows: {theirs}");
    assert_eq!(a.len(), b.len(), "ours:\n{ours}\ntheirs:\n{theirs}");
    for ((la, va), (lb, vb)) in a.iter().zip(&b) {
        assert_eq!(la, lb);
        assert_eq!(va.len(), vb.len());
        for (x, y) in va.iter().zip(vb) {
            assert!(
                (x - y).abs() < 0.0005,
                "{la}: ours {va:?} vs reference {vb:?}"
            );
        }
    }
    let dumped: Value = serde_json::from_slice(&std::fs::read(&rankings).unwrap()).unwrap();
    assert_eq!(
        dumped.as_array().unwrap().len(),
        10,
        "5 scorable questions per conversation"
    );
}

/// `--baseline` end to end: a run compared with the rankings it wrote itself (same kept store)
/// prints a zero difference for every headline figure, and each figure its interval.
#[test]
fn a_run_against_its_own_rankings_differs_by_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = mini_data(dir.path());
    let (store, rankings) = (dir.path().join("store"), dir.path().join("rankings.json"));
    let with = |flag: &str, file: &std::path::Path| {
        let args = [
            "--keep".as_ref(),
            store.as_os_str(),
            flag.as_ref(),
            file.as_os_str(),
        ];
        eval(&data, &args)
    };
    let first = with("--dump-rankings", &rankings);
    assert!(
        first.contains("95% intervals") && first.contains("all recall@30"),
        "{first}"
    );
    let second = with("--baseline", &rankings);
    let against: Vec<&str> = second
        .lines()
        .skip_while(|l| !l.starts_with("against "))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    // recall@30, hit@30, mrr@30, recall@10, multi-hop recall@30, s.hit@1, s.recall@10.
    assert_eq!(against.len(), 7, "{second}");
    for line in against {
        assert!(line.ends_with("+0.000 [+0.000, +0.000]"), "{line}");
    }
}
