#!/usr/bin/env python3
"""Compares the SDKs' committed OpenAPI snapshot (clients/openapi.json) with what a live server
serves at /openapi.json, and fails with a diff naming what changed when they differ.

    python3 scripts/check-clients-drift.py --url http://127.0.0.1:8080
    python3 scripts/check-clients-drift.py --url http://127.0.0.1:8080 --update   # rewrite the snapshot

After --update run `make clients` to regenerate the typed parts of both clients from it.
Standard library only; the comparison is on the parsed JSON (key order and whitespace do not
count), the diff on a canonical rendering (sorted keys, two-space indent).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parent.parent / "clients" / "openapi.json"


def canonical(doc: object) -> list[str]:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False).splitlines(keepends=True)


def summary(committed: dict, live: dict) -> list[str]:
    """The operations and schemas that appeared, disappeared or changed, one line each."""
    lines = []
    for kind, get in (
        ("operation", lambda d: {
            f"{m.upper()} {p}": op
            for p, item in d.get("paths", {}).items()
            for m, op in item.items()
            if isinstance(op, dict)
        }),
        ("schema", lambda d: d.get("components", {}).get("schemas", {})),
    ):
        old, new = get(committed), get(live)
        for name in sorted(new.keys() - old.keys()):
            lines.append(f"  + {kind} {name} (served, not in the snapshot)")
        for name in sorted(old.keys() - new.keys()):
            lines.append(f"  - {kind} {name} (in the snapshot, no longer served)")
        for name in sorted(old.keys() & new.keys()):
            if old[name] != new[name]:
                lines.append(f"  ~ {kind} {name} changed")
    rest = sorted(k for k in committed.keys() | live.keys()
                  if k not in ("paths", "components") and committed.get(k) != live.get(k))
    lines += [f"  ~ top-level {k} changed" for k in rest]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="base URL of a running recollect server")
    ap.add_argument("--snapshot", type=Path, default=SNAPSHOT)
    ap.add_argument("--update", action="store_true", help="write the live document to the snapshot")
    args = ap.parse_args()

    url = args.url.rstrip("/") + "/openapi.json"
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            live = json.load(r)
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
        print(f"check-clients-drift: cannot read {url}: {e}", file=sys.stderr)
        return 2

    if args.update:
        args.snapshot.write_text(json.dumps(live, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"check-clients-drift: wrote {args.snapshot} from {url}; now run `make clients`")
        return 0

    committed = json.loads(args.snapshot.read_text(encoding="utf-8"))
    if committed == live:
        n_ops = sum(1 for item in live.get("paths", {}).values() for op in item.values() if isinstance(op, dict))
        n_schemas = len(live.get("components", {}).get("schemas", {}))
        print(f"check-clients-drift: {args.snapshot.name} matches {url} ({n_ops} operations, {n_schemas} schemas)")
        return 0

    print(f"check-clients-drift: the SDK snapshot {args.snapshot} differs from {url}:", file=sys.stderr)
    for line in summary(committed, live):
        print(line, file=sys.stderr)
    sys.stderr.writelines(difflib.unified_diff(
        canonical(committed), canonical(live),
        fromfile=f"{args.snapshot.name} (committed)", tofile=f"{url} (live)", n=3))
    print(
        "\ncheck-clients-drift: update the snapshot with\n"
        f"  python3 scripts/check-clients-drift.py --url {args.url} --update && make clients\n"
        "then adapt the hand-written clients (clients/python, clients/typescript) to what changed.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
