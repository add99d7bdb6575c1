"""`make bench-peers`: one synthetic workload (`recollect bench --workload-out`) through Recollect's
HTTP API and through mem0 OSS (infer=False, its default local Qdrant store, all-MiniLM-L6-v2 from
~/.cache/recollect/models through ONNX Runtime), on this machine, one system at a time.
scripts/bench-peers.sh sets up the venv, starts and stops the servers and calls the phases:

  bench_peers.py recollect WORKLOAD OUT.json --address-file F --server-pid PID --label L
  bench_peers.py mem0      WORKLOAD OUT.json --model-dir DIR --data-dir DIR
  bench_peers.py report    OUT.json PART.json...

Every phase refuses network connections beyond loopback and records each connection it opens;
the mem0 phase must open none (no LLM, embedding API, telemetry or hub call)."""
import http.client
import json
import os
import socket
import sys
import time
from pathlib import Path

# --- No network: record every connection, refuse anything but loopback ----------------------
CONNECTIONS = []
_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _check(sock, addr):
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        CONNECTIONS.append(f"{addr[0]}:{addr[1]}")
        if addr[0] not in _LOOPBACK:
            raise OSError(f"bench-peers: network refused ({addr[0]}:{addr[1]})")


def _guarded_connect(sock, addr):
    _check(sock, addr)
    return _connect(sock, addr)


def _guarded_connect_ex(sock, addr):
    _check(sock, addr)
    return _connect_ex(sock, addr)


def _guarded_getaddrinfo(host, *a, **kw):
    if host not in _LOOPBACK and host is not None:
        CONNECTIONS.append(f"resolve {host}")
        raise socket.gaierror(f"bench-peers: name lookup refused ({host})")
    return _getaddrinfo(host, *a, **kw)


socket.socket.connect, socket.socket.connect_ex = _guarded_connect, _guarded_connect_ex
socket.getaddrinfo = _guarded_getaddrinfo


def load_workload(path):
    meta, turns, queries, refs = None, [], [], []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            kind = d.pop("type")
            if kind == "meta":
                meta = d
            elif kind == "turn":
                turns.append(d)
            elif kind == "query":
                queries.append(d)
            elif kind == "reference_vector":
                refs.append(d)
    return meta, turns, queries, refs


def pct(xs, p):
    s = sorted(xs)
    return s[round((len(s) - 1) * p)] if s else float("nan")


def quality(queries, ranked_turns):
    """ranked_turns[i]: the distinct turn ids system returned for query i, best first."""
    judged = [(q, r) for q, r in zip(queries, ranked_turns) if q["relevant"]]
    return {
        "nonempty": sum(1 for r in ranked_turns if r) / max(len(ranked_turns), 1),
        "judged_queries": len(judged),
        "hit_at_1": sum(1 for q, r in judged if r[:1] and r[0] in q["relevant"]) / max(len(judged), 1),
        "hit_at_k": sum(1 for q, r in judged if set(r) & set(q["relevant"])) / max(len(judged), 1),
        "mean_distinct_turns": sum(len(r) for r in ranked_turns) / max(len(ranked_turns), 1),
    }


def warmups(refs):
    """Five untimed recalls before the timed ones, with texts that are not among the questions."""
    return [r["text"] for r in refs if r["text"].endswith(".")][:5] or ["warm-up"]


def conversations_of(turns):
    convs = {}
    for t in turns:
        convs.setdefault(t["conversation_id"], []).append(t)
    return convs


# --- Recollect over HTTP --------------------------------------------------------------------
def process_cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phase_recollect(workload, out, address_file, pid, label):
    meta, turns, queries, refs = load_workload(workload)
    deadline = time.time() + 180
    while True:
        if not Path(f"/proc/{pid}").exists():
            sys.exit(f"bench-peers: the recollect server (pid {pid}) exited; see its log")
        if Path(address_file).exists() and Path(address_file).stat().st_size:
            host, port = json.load(open(address_file))["http"].rsplit(":", 1)
            try:
                c = http.client.HTTPConnection(host, int(port), timeout=5)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
        if time.time() > deadline:
            sys.exit("bench-peers: the recollect server was not ready within 180 s")
        time.sleep(0.2)
    conn = http.client.HTTPConnection(host, int(port), timeout=300)

    def call(method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"content-type": "application/json"} if data else {})
        r = conn.getresponse()
        payload = r.read()
        if r.status >= 300:
            sys.exit(f"bench-peers: {method} {path} -> {r.status} {payload[:300]!r}")
        return json.loads(payload) if payload else None

    convs = conversations_of(turns)
    load0 = os.getloadavg()[0]
    cpu0 = process_cpu_s(pid)
    t0 = time.perf_counter()
    # Every conversation's turns without waiting (batches of 250, as `recollect bench` sends
    # them), then each conversation polled until all its turns are recallable.
    for cid, ts in convs.items():
        for i in range(0, len(ts), 250):
            batch = [{k: t[k] for k in ("turn_id", "user", "assistant", "user_speaker", "assistant_speaker", "timestamp")}
                     for t in ts[i:i + 250]]
            call("POST", f"/v1/conversations/{cid}/turns", {"turns": batch, "wait": False})
    durable = time.perf_counter() - t0
    for cid, ts in convs.items():
        while call("GET", f"/v1/conversations/{cid}")["recallable"] < len(ts):
            time.sleep(0.02)
    ingest_s = time.perf_counter() - t0
    ingest_cpu = process_cpu_s(pid) - cpu0
    print(f"  {label}: {len(turns)} turns durable in {durable:.1f} s, all recallable in {ingest_s:.1f} s "
          f"= {len(turns) / ingest_s:.1f} turns/s (server CPU {ingest_cpu / len(turns) * 1000:.1f} ms/turn)", flush=True)

    # Recall is timed once the server is idle again (background index builds after a bulk
    # ingest would otherwise be measured too): under 5 % of a core for 2 s.
    t_settle = time.perf_counter()
    last, idle_since = process_cpu_s(pid), None
    while time.perf_counter() - t_settle < 300:
        time.sleep(0.5)
        now = process_cpu_s(pid)
        busy = (now - last) / 0.5
        last = now
        if busy < 0.05:
            idle_since = idle_since or time.perf_counter()
            if time.perf_counter() - idle_since >= 2.0:
                break
        else:
            idle_since = None
    settle_s = time.perf_counter() - t_settle
    print(f"  {label}: server idle {settle_s:.1f} s after the ingest", flush=True)

    for text in warmups(refs):  # not timed: first-call costs
        call("POST", "/v1/recall", {"query": text, "conversation_ids": [turns[0]["conversation_id"]], "k": 30})
    lat, ranked = [], []
    cpu0 = process_cpu_s(pid)
    for q in queries:
        body = {"query": q["query"], "conversation_ids": q["conversation_ids"], "k": q["k"]}
        t = time.perf_counter()
        res = call("POST", "/v1/recall", body)
        lat.append((time.perf_counter() - t) * 1000)
        ranked.append(list(dict.fromkeys(m["turn_id"] for m in res["memories"])))
    recall_cpu = (process_cpu_s(pid) - cpu0) / max(len(queries), 1) * 1000
    result = {
        "system": label,
        "turns": len(turns),
        "queries": len(queries),
        "ingest_turns_per_s": len(turns) / ingest_s,
        "ingest_s": ingest_s,
        "durable_s": durable,
        "ingest_server_cpu_ms_per_turn": ingest_cpu / len(turns) * 1000,
        "settle_s": settle_s,
        "recall_p50_ms": pct(lat, 0.5),
        "recall_p95_ms": pct(lat, 0.95),
        "recall_p99_ms": pct(lat, 0.99),
        "recall_server_cpu_ms": recall_cpu,
        "load_average_start_end": [load0, os.getloadavg()[0]],
        "quality": quality(queries, ranked),
        "connections": sorted(set(CONNECTIONS)),
        "latencies_ms": lat,
    }
    json.dump(result, open(out, "w"))
    print(f"  {label}: recall p50 {result['recall_p50_ms']:.1f} ms, p99 {result['recall_p99_ms']:.1f} ms", flush=True)


# --- mem0 -----------------------------------------------------------------------------------
def onnx_minilm(model_dir, threads):
    """all-MiniLM-L6-v2 as mem0's embedding model: the model dir's tokenizer.json (truncated at
    256 tokens, batches padded to their longest, as Recollect does) and model.onnx (the graph
    Recollect's embedder.runtime = "onnx" runs) through ONNX Runtime; mean pooling over the
    attention mask, then L2 normalisation."""
    import numpy as np
    import onnxruntime as ort
    from mem0.configs.embeddings.base import BaseEmbedderConfig
    from mem0.embeddings.base import EmbeddingBase
    from tokenizers import Tokenizer

    class OnnxMiniLM(EmbeddingBase):
        def __init__(self):
            super().__init__(BaseEmbedderConfig(model="all-MiniLM-L6-v2", embedding_dims=384))
            self.tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
            self.tokenizer.no_padding()
            self.tokenizer.enable_truncation(256)
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            self.session = ort.InferenceSession(str(Path(model_dir) / "model.onnx"), so,
                                                providers=["CPUExecutionProvider"])

        def vectors(self, texts):
            enc = self.tokenizer.encode_batch(list(texts))
            n = max(len(e.ids) for e in enc)
            ids = np.zeros((len(enc), n), dtype=np.int64)
            mask = np.zeros((len(enc), n), dtype=np.int64)
            for i, e in enumerate(enc):
                ids[i, :len(e.ids)] = e.ids
                mask[i, :len(e.ids)] = 1
            (hidden,) = self.session.run(["last_hidden_state"], {
                "input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
            m = mask[:, :, None].astype(np.float32)
            pooled = (hidden * m).sum(axis=1) / m.sum(axis=1)
            return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

        def embed(self, text, memory_action=None):
            return self.vectors([text])[0].tolist()

        def embed_batch(self, texts, memory_action="add"):
            return [v.tolist() for v in self.vectors(texts)] if texts else []

    return OnnxMiniLM()


def check_vectors(embedder, refs):
    """The peer's vectors against Recollect's own (the reference vectors in the workload, made by
    `recollect bench` with its configured embedder), unit norm, and determinism."""
    import numpy as np
    cos = []
    for r in refs:
        v, ref = np.array(embedder.embed(r["text"]), dtype=np.float64), np.array(r["vector"], dtype=np.float64)
        cos.append(float(v @ ref / np.linalg.norm(v) / np.linalg.norm(ref)))
    probe = refs[0]["text"] if refs else "hello"
    a, b = np.array(embedder.embed(probe)), np.array(embedder.embed(probe))
    batch = np.array(embedder.embed_batch([probe, "a much longer sentence " * 5]))[0]
    check = {
        "reference_texts": len(refs),
        "min_cosine_to_recollect": min(cos) if cos else None,
        "norm": float(np.linalg.norm(a)),
        "identical_text_identical_vector": bool(np.array_equal(a, b)),
        "batched_vs_single_max_abs_diff": float(np.abs(batch - a).max()),
    }
    ok = cos and min(cos) >= 0.999 and abs(check["norm"] - 1) < 1e-4 and check["identical_text_identical_vector"]
    if not ok:
        sys.exit(f"bench-peers: the peer's embedder does not match Recollect's MiniLM: {check}")
    return check


def phase_mem0(workload, out, model_dir, data_dir, threads):
    meta, turns, queries, refs = load_workload(workload)
    import importlib.metadata as md
    from mem0 import Memory
    from mem0.memory import telemetry

    assert not telemetry.MEM0_TELEMETRY, "MEM0_TELEMETRY must be False"
    closed = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    m = Memory.from_config({
        # mem0's default store, Qdrant's local mode (qdrant-client, on disk under path).
        "vector_store": {"provider": "qdrant", "config": {
            "collection_name": "bench", "embedding_model_dims": 384, "path": f"{data_dir}/qdrant"}},
        "history_db_path": f"{data_dir}/history.db",
        # Constructed by mem0 but never called: every request would go to a closed local port.
        "llm": {"provider": "openai", "config": {"api_key": "unused", "openai_base_url": closed}},
        "embedder": {"provider": "openai", "config": {"api_key": "unused", "openai_base_url": closed,
                                                      "embedding_dims": 384}},
    })
    m.embedding_model = onnx_minilm(model_dir, threads)
    check = check_vectors(m.embedding_model, refs)
    print(f"  mem0: embedder check vs Recollect's vectors: min cosine {check['min_cosine_to_recollect']:.7f} "
          f"over {check['reference_texts']} texts, norm {check['norm']:.6f}, "
          f"deterministic {check['identical_text_identical_vector']}", flush=True)

    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    add_lat = []
    for t in turns:
        ta = time.perf_counter()
        r = m.add([{"role": "user", "content": t["user"], "name": t["user_speaker"]},
                   {"role": "assistant", "content": t["assistant"], "name": t["assistant_speaker"]}],
                  user_id=t["conversation_id"], infer=False, metadata={"turn_id": t["turn_id"]})
        add_lat.append((time.perf_counter() - ta) * 1000)
        if len(r["results"]) != 2:
            sys.exit(f"bench-peers: mem0 stored {len(r['results'])} memories for one turn: {r}")
    ingest_s = time.perf_counter() - t0
    print(f"  mem0: {len(turns)} turns added (infer=False) in {ingest_s:.1f} s = {len(turns) / ingest_s:.1f} turns/s "
          f"(add p50 {pct(add_lat, 0.5):.1f} ms)", flush=True)
    stored = m.vector_store.client.count(collection_name="bench").count
    sample = m.get_all(filters={"user_id": turns[0]["conversation_id"]}, top_k=1)["results"]

    for text in warmups(refs):  # not timed: first-call costs
        m.search(text, filters={"user_id": turns[0]["conversation_id"]}, top_k=30)
    lat, ranked = [], []
    for q in queries:
        t = time.perf_counter()
        res = m.search(q["query"], filters={"user_id": q["conversation_ids"][0]}, top_k=q["k"])
        lat.append((time.perf_counter() - t) * 1000)
        ranked.append(list(dict.fromkeys(r["metadata"]["turn_id"] for r in res["results"])))
    versions = {p: md.version(p) for p in ("mem0ai", "qdrant-client", "onnxruntime", "tokenizers", "numpy", "openai")}
    result = {
        "system": "mem0",
        "versions": versions,
        "ort_intra_op_threads": threads,
        "turns": len(turns),
        "queries": len(queries),
        "memories_stored": stored,
        "stored_example": sample[0] if sample else None,
        "ingest_turns_per_s": len(turns) / ingest_s,
        "ingest_s": ingest_s,
        "add_p50_ms": pct(add_lat, 0.5),
        "add_p99_ms": pct(add_lat, 0.99),
        "recall_p50_ms": pct(lat, 0.5),
        "recall_p95_ms": pct(lat, 0.95),
        "recall_p99_ms": pct(lat, 0.99),
        "quality": quality(queries, ranked),
        "load_average_start_end": [load0, os.getloadavg()[0]],
        "embedder_check": check,
        "connections": sorted(set(CONNECTIONS)),
        "latencies_ms": lat,
    }
    m.close()
    json.dump(result, open(out, "w"), default=str)
    print(f"  mem0: {stored} memories stored; recall p50 {result['recall_p50_ms']:.1f} ms, "
          f"p99 {result['recall_p99_ms']:.1f} ms; connections opened: {len(CONNECTIONS)}", flush=True)
    if CONNECTIONS:
        sys.exit(f"bench-peers: mem0 opened connections: {CONNECTIONS}")


# --- The table ------------------------------------------------------------------------------
def phase_report(out, parts):
    rows = [json.load(open(p)) for p in parts]
    mem0 = next((r for r in rows if r["system"] == "mem0"), None)
    print()
    print(f"same workload: {rows[0]['turns']} turns, {rows[0]['queries']} recalls (k=30, one conversation each), "
          f"one system at a time on {os.cpu_count()} cores")
    print("| system | ingest turns/s | recall p50 ms | p99 ms | ingest ×mem0 | p50 ÷mem0 | p99 ÷mem0 "
          "| answered | hit@1 | hit@30 | distinct turns/answer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = r["quality"]
        ratios = ("-", "-", "-") if mem0 is None or r is mem0 else (
            f"{r['ingest_turns_per_s'] / mem0['ingest_turns_per_s']:.2f}×",
            f"{r['recall_p50_ms'] / mem0['recall_p50_ms']:.3f}",
            f"{r['recall_p99_ms'] / mem0['recall_p99_ms']:.3f}")
        print(f"| {r['system']} | {r['ingest_turns_per_s']:.1f} | {r['recall_p50_ms']:.1f} | {r['recall_p99_ms']:.1f} "
              f"| {ratios[0]} | {ratios[1]} | {ratios[2]} | {q['nonempty']:.3f} | {q['hit_at_1']:.3f} | "
              f"{q['hit_at_k']:.3f} | {q['mean_distinct_turns']:.1f} |")
    if mem0:
        print(f"mem0 {mem0['versions']['mem0ai']} (qdrant-client {mem0['versions']['qdrant-client']} local mode, "
              f"onnxruntime {mem0['versions']['onnxruntime']}): infer=False stored {mem0['memories_stored']} memories "
              f"for {mem0['turns']} turns (one per message); connections opened by mem0: "
              f"{len(mem0['connections'])}")
    print("1-minute load average at the start / end of each system's run (2 = both cores busy): " + ", ".join(
        f"{r['system']} {r['load_average_start_end'][0]:.2f} / {r['load_average_start_end'][1]:.2f}" for r in rows))
    print("hit@1/hit@30: the top answer / any answer is a turn that mentions the activity or place the "
          "question asks about (judged queries only); Recollect's latency includes HTTP and JSON on loopback.")
    doc = {"cores": os.cpu_count(), "systems": rows}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    json.dump(doc, open(out, "w"), indent=1, default=str)
    print(f"figures written to {out}")


def main(argv):
    import argparse
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="phase", required=True)
    r = sub.add_parser("recollect")
    r.add_argument("workload")
    r.add_argument("out")
    r.add_argument("--address-file", required=True)
    r.add_argument("--server-pid", type=int, required=True)
    r.add_argument("--label", default="recollect")
    m = sub.add_parser("mem0")
    m.add_argument("workload")
    m.add_argument("out")
    m.add_argument("--model-dir", required=True)
    m.add_argument("--data-dir", required=True)
    m.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: its default)")
    rep = sub.add_parser("report")
    rep.add_argument("out")
    rep.add_argument("parts", nargs="+")
    a = p.parse_args(argv)
    if a.phase == "recollect":
        phase_recollect(a.workload, a.out, a.address_file, a.server_pid, a.label)
    elif a.phase == "mem0":
        phase_mem0(a.workload, a.out, a.model_dir, a.data_dir, a.threads)
    else:
        phase_report(a.out, a.parts)


if __name__ == "__main__":
    main(sys.argv[1:])
