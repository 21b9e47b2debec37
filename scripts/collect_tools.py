"""Rebuild tests/data/real_tools/ from the Berkeley Function Calling Leaderboard's published data.

    .venv/bin/python scripts/collect_tools.py [--cache /tmp/radixlm-tool-pkgs]

Downloads the pinned `bfcl-eval` wheel (pip download --no-deps) into the cache folder (never into the repo)
and writes bfcl.json: every function definition of its test categories once (deduplicated by canonical
content, byte for byte as BFCL wrote it, in BFCL's own type names), every entry's tool set as a list of
those functions, and the entry's ground truth where BFCL publishes one (each argument's accepted values).
The multi-turn categories name their tools by API class; each class's functions are one set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "real_tools" / "bfcl.json"
PACKAGE, VERSION, LICENSE = "bfcl-eval", "2026.3.23", "Apache-2.0"
DATA = "bfcl_eval/data/"
# The categories whose entries carry their tools; memory and web_search reuse a fixed tool set, and
# format_sensitivity repeats simple_python's functions.
SKIP = ("memory", "web_search", "format_sensitivity")


def _wheel(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"bfcl_eval-{VERSION}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(cache),
                        f"{PACKAGE}=={VERSION}"], check=True)
        found = sorted(cache.glob(f"bfcl_eval-{VERSION}-*.whl"))
    return found[0]


def _lines(wheel: zipfile.ZipFile, name: str) -> list[dict]:
    return [json.loads(line) for line in wheel.read(name).decode("utf-8").splitlines() if line.strip()]


def _key(function: dict) -> str:
    return hashlib.sha256(json.dumps(function, sort_keys=True).encode()).hexdigest()[:16]


def collect(wheel_path: Path) -> dict:
    functions: dict[str, dict] = {}
    sets: list[dict] = []

    def add(file: str, ident: str, fns: list[dict], truth: list | None) -> None:
        keys = []
        for fn in fns:
            functions.setdefault(_key(fn), fn)
            keys.append(_key(fn))
        sets.append({"file": file, "id": ident, "functions": keys, **({"ground_truth": truth} if truth else {})})

    with zipfile.ZipFile(wheel_path) as wheel:
        names = set(wheel.namelist())
        for name in sorted(n for n in names if n.startswith(DATA + "BFCL_v4_") and n.endswith(".json")):
            file = name[len(DATA):]
            if any(s in file for s in SKIP):
                continue
            answers_name = f"{DATA}possible_answer/{file}"
            answers = {o["id"]: o["ground_truth"] for o in _lines(wheel, answers_name)} if answers_name in names else {}
            for entry in _lines(wheel, name):
                if entry.get("function"):
                    add(file, entry["id"], entry["function"], answers.get(entry["id"]))
        for name in sorted(n for n in names if n.startswith(DATA + "multi_turn_func_doc/") and n.endswith(".json")):
            file = name[len(DATA):]
            add(file, file.rsplit("/", 1)[-1].removesuffix(".json"), _lines(wheel, name), None)
    return {"source": {"registry": "pypi", "package": PACKAGE, "version": VERSION, "license": LICENSE,
                       "path": DATA},
            "functions": functions, "sets": sets}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/radixlm-tool-pkgs"))
    args = ap.parse_args()
    corpus = collect(_wheel(args.cache))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(corpus, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    answered = sum("ground_truth" in s for s in corpus["sets"])
    print(f"{len(corpus['functions'])} functions, {len(corpus['sets'])} tool sets ({answered} with ground truth)"
          f" -> {OUT.relative_to(ROOT)} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
