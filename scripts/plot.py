#!/usr/bin/env python3
"""Plots of `recollect eval --json` and `recollect bench --json` (SVG, matplotlib):

    plot.py eval EVAL.json OUT.svg    recall@k curve per LoCoMo category (k = 1 .. the deepest k)
    plot.py bench BENCH.json OUT.svg  recall latency CDF of new questions, one line per store size

Run through scripts/plot.sh, which installs matplotlib into the project's venv.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def eval_plot(doc, out):
    rows = doc["runs"]["full"]["metrics"] if "full" in doc["runs"] else next(iter(doc["runs"].values()))["metrics"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    order = sorted(rows, key=lambda r: (r in ("1-4", "all"), r))
    for label in order:
        metrics = rows[label]
        ks = sorted(int(k.split("@")[1]) for k in metrics if k.startswith("curve@"))
        if not ks:
            continue
        ys = [metrics[f"curve@{k}"] for k in ks]
        style = {"linewidth": 2.5, "color": "black"} if label == "all" else {"linewidth": 1.2}
        ax.plot(ks, ys, label=label, **style)
    ax.set_xlabel("k (memories returned)")
    ax.set_ylabel("recall@k (share of the evidence covered)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(f"LoCoMo recall@k by category ({doc['questions']} questions, {doc['embedder']})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)


def bench_plot(doc, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in doc["sizes"]:
        xs = row["latency_percentiles_ms"]
        ax.plot(xs, [p / 100 for p in range(len(xs))], label=f"{row['turns']:,} turns")
    ax.set_xscale("log")
    ax.set_xlabel("recall latency of a new question (ms, log scale)")
    ax.set_ylabel("share of queries")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"Recall latency CDF ({doc['cores']} cores, {doc['embedder']}, {doc['queries_per_size']:,} queries per size)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("eval", "bench"):
        sys.exit(__doc__)
    kind, src, out = sys.argv[1:]
    with open(src) as f:
        doc = json.load(f)
    (eval_plot if kind == "eval" else bench_plot)(doc, out)
    print(f"plot written to {out}")


if __name__ == "__main__":
    main()
