#!/usr/bin/env python3
"""Validates the deploy artefacts against the code: the Helm chart (rendered and linted by Helm's
own engine through helm-python-sdk), the Prometheus alert rules and config, the Grafana
dashboard, the compose file and the Dockerfile.

Metric families, their labels, the config keys and the topic names are read from the Rust
sources, so the checks follow the code. Exit status 1 on any problem, with one line per problem.

    check-deploy.py              check the repository
    check-deploy.py --self-test  also check that deliberately broken copies are caught
    check-deploy.py --sync       first update the chart's schema and copies from their sources
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import json
import re
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

import dockerfile
import jsonschema
import kubernetes_validate
import yaml
from helm_python import chart as helm_chart

REPO = Path(__file__).resolve().parent.parent
NODE_TOOLS = Path(os.environ.get("RECOLLECT_NODE_TOOLS", Path.home() / ".cache/recollect/node-tools"))
# Rendered objects are validated against the Kubernetes API schemas of the oldest version the
# chart supports (Chart.yaml kubeVersion) and the newest the schema package knows.
KUBE_VERSIONS = ["1.25.0", kubernetes_validate.latest_version()]
# The package re-reads its (large) schema files on every call; they never change within a run.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents)
COMPONENTS = ["gateway", "extractor", "embedder", "graph-writer", "consolidator", "query"]
# Stages that scale on their own: the issue asks for an HPA on the workers and query.
AUTOSCALED = ["extractor", "embedder", "graph-writer", "consolidator", "query"]
# Label names Prometheus adds to every scraped series; `le` is a histogram bucket's bound.
SCRAPE_LABELS = {"job", "instance"}
# Series that Prometheus itself makes, allowed besides Recollect's own families.
BUILTIN_SERIES = {"up"}
ALERTS_REQUIRED = {
    "RecollectConsumerLagHigh",
    "RecollectConsumerLagGrowing",
    "RecollectDeadLetters",
    "RecollectHttpErrorRate",
    "RecollectStoreErrors",
    "RecollectRecallLatencyHigh",
    "RecollectNoTurnsAccepted",
    "RecollectTargetDown",
}
PROMQL_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "day_of_month", "day_of_week", "deriv", "exp",
    "floor", "histogram_quantile", "holt_winters", "hour", "idelta", "increase", "irate",
    "label_join", "label_replace", "last_over_time", "ln", "log2", "log10", "max_over_time",
    "min_over_time", "minute", "month", "predict_linear", "quantile_over_time", "rate",
    "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "stddev_over_time",
    "sum_over_time", "time", "timestamp", "vector", "year",
    # aggregation operators
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group",
}
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                   "group_left", "group_right", "inf", "nan"}
# Grafana template functions that hold a PromQL query inside, e.g. label_values(metric, job).
GRAFANA_FUNCTIONS = {"label_values", "query_result", "metrics", "label_names"}


def show(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.notes: list[str] = []
        self.checks = 0

    def check(self, ok: bool, where: str, message: str) -> bool:
        self.checks += 1
        if not ok:
            self.items.append(" ".join(f"{where}: {message}".split()))
        return ok


# ---------------------------------------------------------------------------------------------
# What the code declares


def metric_families(telemetry_src: Path) -> dict[str, dict]:
    """name -> {"kind": counter|gauge|histogram, "labels": set} from shared/telemetry."""
    text = telemetry_src.read_text()
    families: dict[str, dict] = {}
    for m in re.finditer(r'(\w+)\(\s*"(recollect_[a-z0-9_]+)"', text):
        constructor, name = m.group(1), m.group(2)
        rest = text[m.end(): m.end() + 400]
        labels_match = re.search(r"&\[([^\]]*)\]", rest)
        labels = set(re.findall(r'"([a-z_]+)"', labels_match.group(1))) if labels_match else set()
        kind = "histogram" if "histogram" in constructor.lower() else (
            "gauge" if "gauge" in constructor.lower() else "counter")
        families[name] = {"kind": kind, "labels": labels}
    return families


def series_names(families: dict[str, dict]) -> dict[str, str]:
    """Every series name a scrape can show -> its family (histograms: _bucket, _sum, _count)."""
    out: dict[str, str] = {}
    for name, fam in families.items():
        if fam["kind"] == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                out[name + suffix] = name
        else:
            out[name] = name
    return out


def topic_names(model_src: Path) -> list[str]:
    return re.findall(r'pub const \w+: &str = "(recollect\.[a-z.]+)"', model_src.read_text())


def config_defaults(default_toml: Path) -> dict:
    return tomllib.loads(default_toml.read_text())


def workspace_binaries(repo: Path) -> set[str]:
    """Binary names the workspace builds: packages with src/main.rs, plus [[bin]] entries."""
    bins: set[str] = set()
    for manifest in repo.glob("services/*/Cargo.toml"):
        data = tomllib.loads(manifest.read_text())
        if (manifest.parent / "src" / "main.rs").exists():
            bins.add(data.get("package", {}).get("name", manifest.parent.name))
        for b in data.get("bin", []):
            if "name" in b:
                bins.add(b["name"])
        for path in (manifest.parent / "src" / "bin").glob("*.rs"):
            bins.add(path.stem)
    return bins


# ---------------------------------------------------------------------------------------------
# PromQL


def strip_promql(expr: str) -> str:
    """The expression without string literals, label matchers, ranges and grouping clauses."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    return expr


def grafana_to_promql(expr: str) -> str:
    """A panel query with Grafana's variables replaced by values of the right shape."""
    expr = re.sub(r"\$__rate_interval|\$__interval|\$\{__rate_interval\}", "5m", expr)
    expr = re.sub(r"\$__range|\$\{__range\}", "1h", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def check_promql_syntax(exprs: list[tuple[str, str]], p: Problems) -> None:
    """Parses (where, expr) pairs with Prometheus's own grammar (scripts/promql/check.cjs)."""
    env = {**os.environ, "NODE_PATH": str(NODE_TOOLS / "node_modules")}
    try:
        out = subprocess.run(["node", str(REPO / "scripts/promql/check.cjs")], env=env,
                             input=json.dumps([e for _, e in exprs]), capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        p.check(False, "promql", f"the PromQL parser did not run (make setup installs it): "
                                 f"{getattr(e, 'stderr', '') or e}")
        return
    for (where, expr), errors in zip(exprs, json.loads(out)):
        p.check(not errors, where, f"PromQL syntax: {'; '.join(errors)} in {expr!r}")


def check_promql(expr: str, where: str, series: dict[str, str], families: dict[str, dict],
                 p: Problems, used: set[str], syntax: list | None = None) -> None:
    if syntax is not None:
        syntax.append((where, grafana_to_promql(expr)))
    # Label matchers: each {...} belongs to the identifier just before it (if any).
    no_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}", no_strings):
        metric = m.group(1)
        if metric and metric in series:
            allowed = families[series[metric]]["labels"] | SCRAPE_LABELS
            if metric.endswith("_bucket"):
                allowed = allowed | {"le"}
            for label in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!=|!~|=)", m.group(2)):
                p.check(label in allowed, where,
                        f"{metric} has no label {label!r} (labels: {sorted(allowed)})")
    # Grouping labels must exist on some family the expression reads.
    read = {series[n] for n in re.findall(r"\b(recollect_[a-z0-9_]+)\b", expr) if n in series}
    grouping_allowed = set(SCRAPE_LABELS) | {"le"}
    for fam in read:
        grouping_allowed |= families[fam]["labels"]
    for m in re.finditer(r"\b(by|without|on|ignoring)\s*\(([^)]*)\)", no_strings):
        for label in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(2)):
            p.check(label in grouping_allowed, where,
                    f"groups by {label!r}, which no metric it reads carries")
    # label_values(metric, label): the second argument is a label name, not a series.
    body = re.sub(r"\b(label_values\([^,()]*?)\s*,\s*[A-Za-z_]\w*\s*\)", r"\1)", expr)
    body = strip_promql(body)
    body = re.sub(r"\{[^}]*\}", " ", body)
    body = re.sub(r"\$\{?\w+\}?", " ", body)  # Grafana variables
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", body):
        ident, call = m.group(1), m.group(2)
        start = m.start()
        if start > 0 and (body[start - 1].isdigit() or body[start - 1] == "."):
            continue  # the exponent or unit of a number (1e3, 0.5)
        if call:
            p.check(ident in PROMQL_FUNCTIONS or ident in GRAFANA_FUNCTIONS, where,
                    f"unknown PromQL function {ident}()")
            continue
        if ident.lower() in PROMQL_KEYWORDS:
            continue
        if ident in series:
            used.add(series[ident])
            continue
        if ident in families:
            p.check(False, where, f"{ident} is a histogram: use {ident}_bucket, _sum or _count")
            continue
        p.check(ident in BUILTIN_SERIES, where,
                f"{ident} is not a metric family of shared/telemetry/src/lib.rs")
    p.check(expr.count("(") == expr.count(")"), where, "unbalanced parentheses")


# ---------------------------------------------------------------------------------------------
# Alerts, Prometheus config, dashboard


def check_alerts(path: Path, series, families, p: Problems, used: set[str],
                 syntax: list) -> dict | None:
    where = show(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        p.check(False, where, f"not YAML: {e}")
        return None
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if not p.check(isinstance(groups, list) and groups, where, "no rule groups"):
        return None
    names = []
    for g in groups:
        for rule in g.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            rw = f"{where}: {name}"
            names.append(name)
            p.check(bool(name), where, "a rule without alert/record name")
            p.check(isinstance(rule.get("expr"), str) and rule["expr"].strip(), rw, "no expr")
            if "for" in rule:
                p.check(re.fullmatch(r"(\d+[smhdwy])+", str(rule["for"])) is not None, rw,
                        f"bad duration {rule['for']!r}")
            if rule.get("alert"):
                p.check(rule.get("labels", {}).get("severity") in ("warning", "critical"), rw,
                        "severity label must be warning or critical")
                p.check(bool(rule.get("annotations", {}).get("summary")), rw, "no summary")
            if isinstance(rule.get("expr"), str):
                check_promql(rule["expr"], rw, series, families, p, used, syntax)
    p.check(len(names) == len(set(names)), where, "duplicate rule names")
    missing = ALERTS_REQUIRED - set(names)
    p.check(not missing, where, f"required alerts missing: {sorted(missing)}")
    return doc


def check_prometheus_config(path: Path, p: Problems) -> None:
    where = show(path)
    doc = yaml.safe_load(path.read_text())
    jobs = {j["job_name"] for j in doc.get("scrape_configs", [])}
    p.check(set(COMPONENTS) <= jobs, where, f"scrape jobs {sorted(jobs)} miss some of {COMPONENTS}")
    p.check(any(str(r).endswith("alerts.yml") for r in doc.get("rule_files", [])), where,
            "does not load alerts.yml")


def check_dashboard(path: Path, series, families, p: Problems, syntax: list) -> dict | None:
    where = show(path)
    try:
        dash = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        p.check(False, where, f"not JSON: {e}")
        return None
    p.check(bool(dash.get("uid")) and bool(dash.get("title")), where, "needs uid and title")
    variables = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    p.check("datasource" in variables, where, "no datasource variable")
    used: set[str] = set()
    ids = []
    panels = list(dash.get("panels", []))
    for panel in list(panels):
        panels.extend(panel.get("panels", []))  # panels inside collapsed rows
    for panel in panels:
        ids.append(panel.get("id"))
        pw = f"{where}: panel {panel.get('title')!r}"
        grid = panel.get("gridPos", {})
        p.check(all(k in grid for k in "hwxy") and grid.get("x", 0) + grid.get("w", 0) <= 24,
                pw, f"bad gridPos {grid}")
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets", [])
        p.check(bool(targets), pw, "no queries")
        p.check(bool(panel.get("datasource")), pw, "no datasource")
        for t in targets:
            expr = t.get("expr", "")
            if p.check(bool(expr.strip()), pw, f"target {t.get('refId')} has no expr"):
                check_promql(expr, f"{pw} {t.get('refId')}", series, families, p, used, syntax)
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and isinstance(q, str):
            check_promql(q, f"{where}: variable {v.get('name')}", series, families, p, used)
    p.check(len(ids) == len(set(ids)) and None not in ids, where, "panel ids must be unique")
    unused = sorted(set(families) - used)
    if unused:
        p.notes.append(f"note: the dashboard does not chart {', '.join(unused)}")
    return dash


# ---------------------------------------------------------------------------------------------
# Compose and Dockerfile


def compose_schema() -> dict:
    """The Compose Specification's JSON schema, as vendored by check-jsonschema."""
    from importlib.resources import files
    ref = files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    return json.loads(ref.read_text())


def check_compose(path: Path, topics: list[str], p: Problems) -> None:
    where = show(path)
    doc = yaml.safe_load(path.read_text())
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in sorted(validator.iter_errors(doc), key=str)]
    p.check(not errors, where, f"compose schema: {'; '.join(errors[:10])}")
    services = doc.get("services", {})
    for needed in ["kafka", "kafka-topics", "neo4j", "qdrant", "prometheus", "grafana", *COMPONENTS]:
        p.check(needed in services, where, f"no service {needed}")
    for c in COMPONENTS:
        svc = services.get(c, {})
        p.check(svc.get("command") == [f"recollect-{c}"], where,
                f"{c} must run recollect-{c}, runs {svc.get('command')}")
        env = svc.get("environment", {})
        for key in ("RECOLLECT__BUS__KIND", "RECOLLECT__GRAPH__KIND", "RECOLLECT__VECTORS__KIND",
                    "RECOLLECT_API_KEYS"):
            p.check(key in env, where, f"{c} lacks {key}")
        p.check(svc.get("read_only") is True, where, f"{c} should run with a read-only root")
    init = json.dumps(services.get("kafka-topics", {}).get("command", ""))
    for t in topics:
        p.check(t in init, where, f"kafka-topics does not create {t}")


def check_stage_scripts(instructions: list, stages: list[str], scripts_dir: Path, where: str,
                        p: Problems) -> None:
    """Every script a stage's copied scripts call (`$SCRIPT_DIR/x`) is copied into that stage too.
    No Docker daemon runs here, so a missing one would first fail a user's `docker build`."""
    copied: list[set[str]] = []
    whole: set[int] = set()
    for ins in instructions:
        if ins.cmd == "FROM":
            copied.append(set())
        if ins.cmd == "COPY" and copied and not any(f.startswith("--from=") for f in ins.flags):
            for src in ins.value[:-1]:
                if src in (".", "./"):
                    whole.add(len(copied) - 1)
                elif src.startswith("scripts/"):
                    copied[-1].add(src[len("scripts/"):])
    for st, names in enumerate(copied):
        if st in whole:
            continue
        todo, seen = sorted(n for n in names if n.endswith(".sh")), set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            script = scripts_dir / name
            if not p.check(script.is_file(), where, f"COPY scripts/{name}: no such script"):
                continue
            for ref in sorted(set(re.findall(r"\$SCRIPT_DIR/(\w[\w.-]*)", script.read_text()))):
                p.check(ref in names, where, f"stage {stages[st] or st} copies scripts/{name}, which "
                                             f"calls scripts/{ref}, not copied into it")
                if ref.endswith(".sh"):
                    todo.append(ref)


def check_dockerfile(path: Path, binaries: set[str], p: Problems, scripts_dir: Path) -> None:
    where = show(path)
    text = path.read_text()
    # BuildKit's own parser: syntax, stages, and that every COPY --from names an earlier stage.
    try:
        instructions = dockerfile.parse_file(str(path))
    except dockerfile.GoParseError as e:
        p.check(False, where, f"does not parse: {e}")
        return
    stages: list[str] = []
    for ins in instructions:
        if ins.cmd == "FROM":
            parts = [v.lower() for v in ins.value]
            stages.append(parts[2] if len(parts) == 3 and parts[1] == "as" else "")
        if ins.cmd == "COPY":
            for flag in ins.flags:
                if flag.startswith("--from="):
                    p.check(flag[7:] in stages[:-1], where, f"COPY {flag} names no earlier stage")
    p.check(stages[-1:] == ["runtime"], where, f"the last stage should be runtime, stages {stages}")
    check_stage_scripts(instructions, stages, scripts_dir, where, p)
    last_user = [ins.value[0] for ins in instructions if ins.cmd == "USER"][-1:]
    p.check(last_user and last_user[0].split(":")[0] not in ("0", "root"), where, "runs as root")
    for needle, why in [
        ("FROM rust:1.95-bookworm AS build", "builder stage"),
        ("cargo build --release --locked --bins", "release build of every binary"),
        ("scripts/setup-model.sh", "model stage"),
        ("FROM debian:bookworm-slim", "runtime stage"),
        ("USER 10001", "non-root user"),
        ("RECOLLECT_MODEL_DIR=/opt/recollect/models/all-MiniLM-L6-v2", "model location"),
        ("RECOLLECT__SERVER__LISTEN=0.0.0.0:8080", "listen address"),
    ]:
        p.check(needle in text, where, f"missing {why} ({needle!r})")
    wanted = {f"recollect-{c}" for c in COMPONENTS} | {"recollect", "recollect-store"}
    missing = sorted(wanted - binaries)
    services_built = wanted & binaries - {"recollect"}
    if missing and not services_built:
        # Before the distributed mode lands no service binary exists: say so, loudly. Once some
        # do, every one the image, compose file and chart run must.
        p.notes.append(f"WARNING: the workspace builds no {', '.join(missing)} yet; the image, "
                       f"compose file and chart run them")
    else:
        p.check(not missing, where, f"the workspace builds no {', '.join(missing)}, which the "
                                    f"image, compose file and chart run")


# ---------------------------------------------------------------------------------------------
# Helm


def load_values(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_config_toml(text: str, where: str, defaults: dict, p: Problems) -> None:
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        p.check(False, where, f"recollect.toml is not TOML: {e}")
        return
    for section, entries in cfg.items():
        if not p.check(section in defaults and isinstance(entries, dict), where,
                       f"[{section}] is not a section of default.toml"):
            continue
        for key, value in entries.items():
            if not p.check(key in defaults[section], where,
                           f"{section}.{key} is not a key of default.toml"):
                continue
            want = type(defaults[section][key])
            p.check(isinstance(value, want) and not (want is int and isinstance(value, bool)),
                    where, f"{section}.{key} = {value!r} should be {want.__name__}")
            if want is dict and isinstance(value, dict):
                # A table's keys are the default's, with a number where it has a number.
                for k, v in value.items():
                    d = defaults[section][key].get(k)
                    p.check(d is not None and isinstance(v, (int, float)) == isinstance(d, (int, float)),
                            where, f"{section}.{key}.{k} = {v!r} is not a key of default.toml's table")
    p.check(not cfg.get("server", {}).get("api_keys"), where, "API keys in the ConfigMap")
    p.check(not cfg.get("graph", {}).get("password"), where, "a password in the ConfigMap")


def render_scenario(chart_dir: Path, name: str, values: dict | None, p: Problems):
    where = f"helm[{name}]"
    lint = helm_chart.lint(str(chart_dir), values, strict=True)
    for msg in lint.get("messages", []):
        p.check(msg.get("severity", 0) < 2, where, f"lint: {msg.get('path')}: {msg.get('error')}")
    for err in lint.get("errors", []):
        p.check(False, where, f"lint: {err}")
    try:
        with helm_chart.Chart.load(str(chart_dir)) as ch:
            rendered = ch.render(values, name="rel", namespace="memory", is_install=True)
            merged = ch.merge_values(values)
    except Exception as e:  # a template that fails to render is the finding itself
        p.check(False, where, f"render failed: {e}")
        return None, None
    return rendered, merged


def check_manifests(name: str, rendered: dict[str, str], values: dict, defaults: dict,
                    alerts: dict | None, dashboard: dict | None, p: Problems) -> set[str]:
    """Checks one rendering; returns the template files that rendered something."""
    where = f"helm[{name}]"
    docs: list[tuple[str, dict]] = []
    non_empty: set[str] = set()
    for template, text in rendered.items():
        if template.endswith("NOTES.txt"):
            p.check(bool(text.strip()), where, "NOTES.txt renders empty")
            continue
        if not text.strip():
            continue
        try:
            parsed = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as e:
            p.check(False, f"{where} {template}", f"not YAML: {e}")
            continue
        p.check(bool(parsed), f"{where} {template}", "renders only comments or blank documents")
        if parsed:
            non_empty.add(template)
        for d in parsed:
            tw = f"{where} {template}"
            if p.check(isinstance(d, dict) and d.get("apiVersion") and d.get("kind")
                       and d.get("metadata", {}).get("name"), tw, "object without apiVersion/kind/name"):
                p.check(len(d["metadata"]["name"]) <= 63, tw, f"name too long: {d['metadata']['name']}")
                docs.append((template, d))
    for template, d in docs:
        for version in KUBE_VERSIONS:
            problem = None
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                # CRDs (ServiceMonitor, PrometheusRule) have no schema in the package.
                p.check(d["apiVersion"].startswith("monitoring.coreos.com/"), f"{where} {template}",
                        f"no Kubernetes {version} schema for {d['apiVersion']} {d['kind']}")
                continue
            except kubernetes_validate.ValidationError as e:
                problem = e.message
            p.check(problem is None, f"{where} {template} {d['kind']} {d['metadata']['name']}",
                    f"Kubernetes {version} schema: {problem}")
    keys = [(d["kind"], d["metadata"]["name"]) for _, d in docs]
    kinds: dict[str, int] = {}
    for kind, _ in keys:
        kinds[kind] = kinds.get(kind, 0) + 1
    p.notes.append(f"{where}: rendered " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    p.check(len(keys) == len(set(keys)), where, "duplicate objects")

    def of_kind(kind: str) -> list[dict]:
        return [d for _, d in docs if d["kind"] == kind]

    enabled = [c for c in COMPONENTS if values.get(c, {}).get("enabled")]
    if values.get("store", {}).get("enabled"):
        enabled.append("store")
    deployments = {d["metadata"]["labels"].get("app.kubernetes.io/component"): d
                   for d in of_kind("Deployment")}
    p.check(sorted(deployments) == sorted(enabled), where,
            f"Deployments {sorted(deployments)} but enabled components {sorted(enabled)}")
    configmaps = {d["metadata"]["name"]: d for d in of_kind("ConfigMap")}
    secrets = {d["metadata"]["name"]: d for d in of_kind("Secret")}
    existing_secret = values.get("secrets", {}).get("existingSecret")
    config = values.get("config", {})
    graph_kind = config.get("graph", {}).get("kind")
    sasl = str(config.get("bus", {}).get("security_protocol", "")).startswith("sasl_")
    qdrant = config.get("vectors", {}).get("kind") == "qdrant"
    # CA files the config names: each must be in a volume the pods mount.
    ca_files = [(k, config.get(sec, {}).get(key)) for k, sec, key in
                (("bus.ssl_ca_file", "bus", "ssl_ca_file"), ("graph.ca_file", "graph", "ca_file"))
                if config.get(sec, {}).get(key)]

    for component, dep in deployments.items():
        dw = f"{where} Deployment {dep['metadata']['name']}"
        spec = dep["spec"]
        pod = spec["template"]["spec"]
        p.check(selects(spec["selector"].get("matchLabels", {}),
                        spec["template"]["metadata"].get("labels", {})), dw,
                "selector does not match the pod labels")
        pod_sc = pod.get("securityContext", {})
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        containers = pod.get("containers", [])
        p.check(bool(containers), dw, "no containers")
        for c in containers:
            cw = f"{dw} container {c.get('name')}"
            ports = {pt.get("name") for pt in c.get("ports", [])} | {pt.get("containerPort") for pt in c.get("ports", [])}
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                get = c.get(probe, {}).get("httpGet", {})
                p.check(get.get("path") == path, cw, f"{probe} must GET {path}, has {get or 'none'}")
                p.check(get.get("port") in ports, cw, f"{probe} port {get.get('port')} is not a container port")
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    p.check(bool(res.get(part, {}).get(r)), cw, f"resources.{part}.{r} missing")
            sc = {**pod_sc, **c.get("securityContext", {})}
            p.check(sc.get("runAsNonRoot") is True, cw, "runAsNonRoot is not true")
            p.check(sc.get("readOnlyRootFilesystem") is True, cw, "readOnlyRootFilesystem is not true")
            p.check(sc.get("allowPrivilegeEscalation") is False, cw, "allowPrivilegeEscalation is not false")
            p.check("ALL" in sc.get("capabilities", {}).get("drop", []), cw, "capabilities do not drop ALL")
            p.check(sc.get("privileged") is not True, cw, "privileged")
            p.check(bool(c.get("image")), cw, "no image")
            p.check((c.get("args") or c.get("command") or [None])[0] == f"recollect-{component}", cw,
                    f"does not run recollect-{component}")
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
            for m in mounts.values():
                p.check(m["name"] in volumes, cw, f"mount {m['name']} has no volume")
            p.check("/tmp" in mounts and not mounts["/tmp"].get("readOnly"), cw,
                    "no writable /tmp under a read-only root")
            env = {e["name"]: e for e in c.get("env", [])}
            # Config: RECOLLECT_CONFIG names a file in a mounted ConfigMap that has that key.
            cfg_path = env.get("RECOLLECT_CONFIG", {}).get("value", "")
            mount_dir, _, cfg_key = cfg_path.rpartition("/")
            mount = mounts.get(mount_dir)
            if p.check(mount is not None, cw, f"RECOLLECT_CONFIG {cfg_path!r} is not in a mounted volume"):
                cm_name = volumes.get(mount["name"], {}).get("configMap", {}).get("name")
                cm = configmaps.get(cm_name)
                if p.check(cm is not None and cfg_key in cm.get("data", {}), cw,
                           f"config volume must be a rendered ConfigMap holding {cfg_key}"):
                    check_config_toml(cm["data"][cfg_key], f"{where} ConfigMap {cm_name}", defaults, p)
            data_dir = env.get("RECOLLECT__STORAGE__DATA_DIR", {}).get("value")
            p.check(data_dir in mounts and not mounts[data_dir].get("readOnly"), cw,
                    f"data dir {data_dir} is not a writable mount")
            # Secrets: API keys (and the Neo4j password) from the Secret, by reference.
            secret_envs = ["RECOLLECT_API_KEYS"] + (["RECOLLECT__GRAPH__PASSWORD"] if graph_kind == "neo4j" else [])
            # Managed services: the Kafka SASL password, the Qdrant API key.
            secret_envs += ["RECOLLECT__BUS__SASL_PASSWORD"] if sasl else []
            secret_envs += ["RECOLLECT__VECTORS__API_KEY"] if qdrant else []
            for key, path in ca_files:
                p.check(any(str(path).startswith(m.rstrip("/") + "/") for m in mounts), cw,
                        f"{key} {path} is in no mounted volume (caCertificates mounts /etc/recollect-ca)")
            if "RECOLLECT__LLM__API_KEY" in env:
                secret_envs.append("RECOLLECT__LLM__API_KEY")
            for var in secret_envs:
                ref = env.get(var, {}).get("valueFrom", {}).get("secretKeyRef")
                if not p.check(ref is not None, cw, f"{var} does not come from a Secret"):
                    continue
                if existing_secret:
                    p.check(ref["name"] == existing_secret, cw,
                            f"{var} reads Secret {ref['name']}, not secrets.existingSecret {existing_secret}")
                else:
                    sec = secrets.get(ref["name"])
                    p.check(sec is not None and ref["key"] in sec.get("data", {}), cw,
                            f"{var} reads {ref['name']}/{ref['key']}, which the chart does not render")
        if component == "store":
            claim = volumes.get("data", {}).get("persistentVolumeClaim", {}).get("claimName")
            p.check(claim in {d["metadata"]["name"] for d in of_kind("PersistentVolumeClaim")}, dw,
                    "the store's data volume is not the chart's PersistentVolumeClaim")
            p.check(spec.get("replicas") == 1 and spec.get("strategy", {}).get("type") == "Recreate",
                    dw, "the store must run one replica with the Recreate strategy")

    # Remote stores: every service reaches the recollect-store Service the chart renders, and the
    # store itself runs the embedded engines.
    service_names = {d["metadata"]["name"] for d in of_kind("Service")}
    for component, dep in deployments.items():
        env = {e["name"]: e.get("value") for c in dep["spec"]["template"]["spec"]["containers"]
               for e in c.get("env", [])}
        dw = f"{where} Deployment {dep['metadata']['name']}"
        if component == "store":
            p.check(env.get("RECOLLECT__GRAPH__KIND") == "embedded"
                    and env.get("RECOLLECT__VECTORS__KIND") == "embedded", dw,
                    "the store must host the embedded graph and vectors")
        elif "store" in deployments:
            host = re.sub(r"^https?://([^:/]+).*$", r"\1", env.get("RECOLLECT__REMOTE__URL") or "")
            p.check(host in service_names, dw, f"remote.url host {host!r} is not a rendered Service")

    pod_labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in deployments.items()}
    container_ports = {n: {pt.get("name") for c in d["spec"]["template"]["spec"]["containers"]
                           for pt in c.get("ports", [])} for n, d in deployments.items()}
    services = of_kind("Service")
    for svc in services:
        sw = f"{where} Service {svc['metadata']['name']}"
        targets = [n for n, labels in pod_labels.items() if selects(svc["spec"].get("selector", {}), labels)]
        if p.check(len(targets) == 1, sw, f"selects {targets}, not one Deployment's pods"):
            for port in svc["spec"].get("ports", []):
                tp = port.get("targetPort")
                p.check(isinstance(tp, int) or tp in container_ports[targets[0]], sw,
                        f"targetPort {tp} is not a container port")
    for needed in ("gateway", "query"):
        if needed in enabled:
            p.check(any(s["metadata"]["labels"].get("app.kubernetes.io/component") == needed
                        for s in services), where, f"no Service for {needed}")

    hpas = of_kind("HorizontalPodAutoscaler")
    dep_names = {d["metadata"]["name"]: n for n, d in deployments.items()}
    scaled = set()
    for h in hpas:
        hw = f"{where} HPA {h['metadata']['name']}"
        ref = h["spec"]["scaleTargetRef"]
        if p.check(ref.get("kind") == "Deployment" and ref.get("name") in dep_names, hw,
                   f"targets {ref}, which is not rendered"):
            scaled.add(dep_names[ref["name"]])
            p.check("replicas" not in deployments[dep_names[ref["name"]]]["spec"], hw,
                    "its Deployment also fixes replicas (they would fight)")
        p.check(1 <= h["spec"].get("minReplicas", 1) <= h["spec"]["maxReplicas"], hw, "minReplicas > maxReplicas")
        p.check(bool(h["spec"].get("metrics")), hw, "no metrics to scale on")
    for c in AUTOSCALED:
        if c in enabled and values.get(c, {}).get("autoscaling", {}).get("enabled"):
            p.check(c in scaled, where, f"{c} has autoscaling enabled but no HPA")
    if name == "default":
        p.check(set(AUTOSCALED) <= scaled, where, f"by default every worker and query autoscale; HPAs for {sorted(scaled)}")

    for pdb in of_kind("PodDisruptionBudget"):
        sel = pdb["spec"].get("selector", {}).get("matchLabels", {})
        p.check(any(selects(sel, labels) for labels in pod_labels.values()),
                f"{where} PDB {pdb['metadata']['name']}", "selects no Deployment's pods")

    monitors = of_kind("ServiceMonitor")
    if values.get("serviceMonitor", {}).get("enabled"):
        p.check(len(monitors) == 1, where, "serviceMonitor.enabled but no ServiceMonitor")
    for sm in monitors:
        mw = f"{where} ServiceMonitor {sm['metadata']['name']}"
        sel = sm["spec"].get("selector", {}).get("matchLabels", {})
        chosen = [s for s in services if selects(sel, s["metadata"].get("labels", {}))]
        chosen_components = sorted(s["metadata"]["labels"].get("app.kubernetes.io/component") for s in chosen)
        p.check(chosen_components == sorted(enabled), mw,
                f"selects Services of {chosen_components}, should select every component {sorted(enabled)}")
        for ep in sm["spec"].get("endpoints", []):
            p.check(ep.get("path") == "/metrics", mw, "endpoint path is not /metrics")
            for s in chosen:
                p.check(ep.get("port") in {pt.get("name") for pt in s["spec"]["ports"]}, mw,
                        f"port {ep.get('port')} is not a port of {s['metadata']['name']}")
        job_label = sm["spec"].get("jobLabel")
        p.check(all(job_label in s["metadata"]["labels"] for s in chosen), mw,
                f"jobLabel {job_label} is not a label of every Service")

    for rule in of_kind("PrometheusRule"):
        p.check(alerts is not None and rule["spec"].get("groups") == alerts.get("groups"),
                f"{where} PrometheusRule", "differs from deploy/prometheus/alerts.yml")
    for cm in configmaps.values():
        if "recollect-dashboard.json" in cm.get("data", {}):
            p.check(dashboard is not None and json.loads(cm["data"]["recollect-dashboard.json"]) == dashboard,
                    f"{where} dashboard ConfigMap", "differs from deploy/grafana/recollect-dashboard.json")
    return non_empty


# Helm reads only files inside the chart, so it carries copies of these (source, copy).
CHART_COPIES = [
    ("deploy/prometheus/alerts.yml", "helm/recollect/files/alerts.yml"),
    ("deploy/grafana/recollect-dashboard.json", "helm/recollect/files/recollect-dashboard.json"),
]
# Keys the chart sets itself (env) or takes from the Secret: values.schema.json refuses them.
CHART_SET_KEYS = {("server", "listen"), ("server", "grpc_listen"), ("server", "api_keys"), ("graph", "password"),
                  ("remote", "token"), ("llm", "api_key"), ("bus", "sasl_password"),
                  ("vectors", "api_key"),
                  ("storage", "data_dir"), ("embedder", "model_dir")}
SCHEMA_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def check_values_schema(chart_dir: Path, defaults: dict, p: Problems) -> None:
    """The schema's `config` follows default.toml: every key, with its type, nothing else."""
    where = show(chart_dir / "values.schema.json")
    schema = json.loads((chart_dir / "values.schema.json").read_text())
    sections = schema["properties"]["config"]["properties"]
    for section, entries in defaults.items():
        props = sections.get(section, {}).get("properties", {})
        for key, value in entries.items():
            if (section, key) in CHART_SET_KEYS:
                p.check(key not in props, where, f"config.{section}.{key} is set by the chart; drop it")
                continue
            want = SCHEMA_TYPES[type(value)]
            p.check(props.get(key, {}).get("type") == want, where,
                    f"config.{section}.{key} should be in the schema with type {want} "
                    f"(scripts/check-deploy.py --sync adds it)")
        for key in props:
            p.check(key in entries, where, f"config.{section}.{key} is not in default.toml")
    for section in sections:
        p.check(section in defaults, where, f"config.{section} is not a section of default.toml")


def sync_values_schema(chart_dir: Path, defaults: dict) -> None:
    """Rewrites the schema's `config` from default.toml, keeping enums and descriptions of
    keys whose type did not change (run after adding or removing a config key)."""
    path = chart_dir / "values.schema.json"
    schema = json.loads(path.read_text())
    old = schema["properties"]["config"]["properties"]
    new = {}
    for section, entries in defaults.items():
        props = {}
        for key, value in entries.items():
            if (section, key) in CHART_SET_KEYS:
                continue
            want = SCHEMA_TYPES[type(value)]
            kept = old.get(section, {}).get("properties", {}).get(key, {})
            props[key] = kept if kept.get("type") == want else (
                {"type": want, "items": {"type": "string"}} if want == "array" else {"type": want})
        new[section] = {"type": "object", "additionalProperties": False, "properties": props}
    schema["properties"]["config"]["properties"] = new
    path.write_text(json.dumps(schema, indent=2) + "\n")
    print(f"wrote {show(path)}: config follows shared/config/config/default.toml")


def check_chart(chart_dir: Path, deploy_dir: Path, defaults: dict, alerts, dashboard,
                p: Problems) -> None:
    check_values_schema(chart_dir, defaults, p)
    scenarios = {"default": None, "production": load_values(chart_dir / "values-production.yaml")}
    for extra in sorted((chart_dir / "ci").glob("*.yaml")):
        scenarios[f"ci/{extra.name}"] = load_values(extra)
    rendered_somewhere: set[str] = set()
    for name, values in scenarios.items():
        rendered, merged = render_scenario(chart_dir, name, values, p)
        if rendered is None:
            continue
        try:
            rendered_somewhere |= check_manifests(name, rendered, merged, defaults, alerts,
                                                  dashboard, p)
        except (KeyError, TypeError, AttributeError, IndexError) as e:
            # An object missing a field the checks rely on is a finding, not a crash.
            p.check(False, f"helm[{name}]", f"a rendered object lacks an expected field: {e!r}")
    templates = {f"{chart_dir.name}/templates/{t.name}" for t in (chart_dir / "templates").glob("*.yaml")}
    never = sorted(templates - rendered_somewhere)
    p.check(not never, "helm", f"templates that render empty with every value set: {never}")
    for f in ("files/alerts.yml", "files/recollect-dashboard.json"):
        src = deploy_dir / ("prometheus/alerts.yml" if f.endswith(".yml") else "grafana/recollect-dashboard.json")
        p.check((chart_dir / f).read_bytes() == src.read_bytes(), f"helm {f}",
                f"differs from {show(src)}: scripts/check-deploy.py --sync copies it")


# ---------------------------------------------------------------------------------------------


def run_all(repo: Path, chart_dir: Path, alerts_path: Path, dashboard_path: Path,
            deploy_dir: Path | None = None) -> Problems:
    deploy_dir = deploy_dir or repo / "deploy"
    p = Problems()
    families = metric_families(repo / "shared/telemetry/src/lib.rs")
    p.check(len(families) >= 10, "shared/telemetry/src/lib.rs",
            f"found only {len(families)} metric families: has the way metrics are declared changed?")
    series = series_names(families)
    topics = topic_names(repo / "shared/model/src/lib.rs")
    p.check(len(topics) >= 5, "shared/model/src/lib.rs", f"found topics {topics}")
    defaults = config_defaults(repo / "shared/config/config/default.toml")
    used: set[str] = set()
    syntax: list[tuple[str, str]] = []
    alerts = check_alerts(alerts_path, series, families, p, used, syntax)
    check_prometheus_config(deploy_dir / "prometheus/prometheus.yml", p)
    dashboard = check_dashboard(dashboard_path, series, families, p, syntax)
    check_promql_syntax(syntax, p)
    check_compose(deploy_dir / "compose.yaml", topics, p)
    check_dockerfile(deploy_dir / "Dockerfile", workspace_binaries(repo), p, repo / "scripts")
    check_chart(chart_dir, deploy_dir, defaults, alerts, dashboard, p)
    return p


def self_test() -> int:
    """Breaks copies of the artefacts in known ways and checks each break is reported."""
    # (what, file, mutation, a phrase the report must contain)
    mutations = [
        ("a Deployment without a readiness probe", "helm/recollect/templates/deployment.yaml",
         lambda s: re.sub(r"          readinessProbe:\n.*?\n(.*?\n){1}", "", s, count=1, flags=re.S),
         "readinessProbe must GET /readyz"),
        ("containers without resource limits", "helm/recollect/templates/deployment.yaml",
         lambda s: s.replace("{{- toYaml $c.resources | nindent 12 }}",
                             "requests: {cpu: 100m, memory: 64Mi}", 1),
         "resources.limits.cpu missing"),
        ("a writable root filesystem", "helm/recollect/values.yaml",
         lambda s: s.replace("readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false"),
         "readOnlyRootFilesystem is not true"),
        ("an alert on a metric that does not exist", "deploy/prometheus/alerts.yml",
         lambda s: s.replace("recollect_store_errors_total[5m]", "recollect_store_failures_total[5m]"),
         "recollect_store_failures_total is not a metric family"),
        ("a dashboard query on a histogram without _bucket", "deploy/grafana/recollect-dashboard.json",
         lambda s: s.replace("rate(recollect_store_write_duration_seconds_bucket", "rate(recollect_store_write_duration_seconds", 1),
         "is a histogram: use"),
        ("an alert that is not PromQL", "deploy/prometheus/alerts.yml",
         lambda s: s.replace("[10m])) > 0\n", "[10m])) >> 0\n", 1),
         "PromQL syntax"),
        ("a dashboard query that is not PromQL", "deploy/grafana/recollect-dashboard.json",
         lambda s: s.replace("sum by (reason) (rate(", "sum by (reason) (rates(", 1),
         "PromQL syntax"),
        ("a label the metric does not carry", "deploy/prometheus/alerts.yml",
         lambda s: s.replace('{outcome="dlq"}', '{result="dlq"}'),
         "has no label 'result'"),
        ("a config key the services do not know", "helm/recollect/values.yaml",
         lambda s: s.replace("    batch_size: 64\n", "    batch_size: 64\n    batch_sise: 64\n"),
         "batch_sise"),
        ("values the schema refuses", "helm/recollect/values-production.yaml",
         lambda s: s.replace("  replicas: 3\n", "  replicas: three\n", 1),
         "got string, want integer"),
        ("a ServiceMonitor that selects nothing", "helm/recollect/templates/servicemonitor.yaml",
         lambda s: s.replace('recollect.io/metrics: "true"', 'recollect.io/scrape: "true"'),
         "selects Services of []"),
        ("an HPA on a Deployment that is not rendered", "helm/recollect/templates/hpa.yaml",
         lambda s: s.replace("name: {{ include \"recollect.fullname\" $root }}-{{ $component }}\n  minReplicas",
                             "name: {{ include \"recollect.fullname\" $root }}-{{ $component }}-x\n  minReplicas"),
         "which is not rendered"),
        ("a field Kubernetes does not know", "helm/recollect/templates/deployment.yaml",
         lambda s: s.replace("              protocol: TCP", "              protocl: TCP", 1),
         "Kubernetes 1.25.0 schema"),
        ("a compose service with an unknown key", "deploy/compose.yaml",
         lambda s: s.replace("  qdrant:\n    image:", "  qdrant:\n    imagee:", 1),
         "compose schema"),
        ("a SASL password not taken from the Secret", "helm/recollect/templates/deployment.yaml",
         lambda s: s.replace("hasPrefix \"sasl_\"", "hasPrefix \"sasl-\"", 1),
         "RECOLLECT__BUS__SASL_PASSWORD does not come from a Secret"),
        ("a CA file the pods do not mount", "helm/recollect/templates/deployment.yaml",
         lambda s: s.replace("mountPath: /etc/recollect-ca", "mountPath: /etc/recollect-certs", 1),
         "is in no mounted volume"),
        ("a COPY from a stage that does not exist", "deploy/Dockerfile",
         lambda s: s.replace("COPY --from=model", "COPY --from=modle", 1),
         "names no earlier stage"),
        ("a script the model stage calls but does not copy", "deploy/Dockerfile",
         lambda s: s.replace(" scripts/unpack-model.py", "", 1),
         "calls scripts/unpack-model.py, not copied into it"),
    ]
    failures = 0
    for what, rel, mutate, expected in mutations:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            for d in ("helm", "deploy"):
                shutil.copytree(REPO / d, root / d)
            target = root / rel
            before = target.read_text()
            after = mutate(before)
            if after == before:
                print(f"  self-test: mutation '{what}' did not apply to {rel}")
                failures += 1
                continue
            target.write_text(after)
            # A broken copy under deploy/ must also break the chart's copy of it.
            for src, dst in CHART_COPIES:
                if rel == src:
                    shutil.copy(root / src, root / dst)
            p = run_all(REPO, root / "helm/recollect", root / "deploy/prometheus/alerts.yml",
                        root / "deploy/grafana/recollect-dashboard.json", deploy_dir=root / "deploy")
            hits = [item for item in p.items if expected in item]
            if hits:
                print(f"  self-test: caught {what}: {hits[0]}")
            else:
                print(f"  self-test: NOT caught: {what} (reported: {p.items[:3]})")
                failures += 1
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--self-test", action="store_true",
                    help="also check that deliberately broken copies of the artefacts are caught")
    ap.add_argument("--sync", action="store_true",
                    help="first rewrite what follows other files: the config part of "
                         "helm/recollect/values.schema.json (from default.toml) and the chart's "
                         "copies of the alerts and the dashboard (from deploy/)")
    args = ap.parse_args()
    if args.sync:
        sync_values_schema(REPO / "helm/recollect",
                           config_defaults(REPO / "shared/config/config/default.toml"))
        for src, dst in CHART_COPIES:
            shutil.copyfile(REPO / src, REPO / dst)
            print(f"copied {src} to {dst}")
    p = run_all(REPO, REPO / "helm/recollect", REPO / "deploy/prometheus/alerts.yml",
                REPO / "deploy/grafana/recollect-dashboard.json")
    for note in p.notes:
        print(f"  {note}")
    for item in p.items:
        print(f"  FAIL {item}")
    print(f"deploy checks: {p.checks - len(p.items)} passed, {len(p.items)} failed")
    failed = bool(p.items)
    if args.self_test:
        broken = self_test()
        print(f"deploy self-test: {'all breaks caught' if not broken else f'{broken} breaks not caught'}")
        failed = failed or broken > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
