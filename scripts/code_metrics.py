"""Readability metrics for a Python source tree: decision density, branchy functions, line widths, notebook lines.

    python scripts/code_metrics.py                     # radixlm/ (notebook counts also over tests/ and docs/)
    python scripts/code_metrics.py radixlm/runtime/speculative --json

Decision points (ast): if / elif, for, while, except, a conditional expression, each `and` / `or` operand
beyond the first, each comprehension's `for` and `if` clauses. Code lines: lines holding a token other than a
comment (tokenize), docstrings included. A function's branches are its own decision points (nested functions
count for themselves). "Measurement lines" is a heuristic: comment or docstring lines with a number followed by
a unit (ms, us, s, x, tok/s, GB/s, %, MiB, ...).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import statistics
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = re.compile(r"\b(session|issue)\s+\d+", re.IGNORECASE)
MEASUREMENT = re.compile(r"\d(?:\.\d+)?\s?(?:ms|us|µs|s|x|tok/s|GB/s|%|MiB|GiB|MB|GB|KB)(?![A-Za-z0-9_])")
SKIP_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
               tokenize.ENCODING, tokenize.ENDMARKER}
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
SCOPES = (*FUNCS, ast.ClassDef, ast.Lambda)


def decisions(node: ast.AST) -> int:
    """The decision points of one node itself (not its children)."""
    if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.IfExp)):
        return 1
    if isinstance(node, ast.BoolOp):
        return len(node.values) - 1
    if isinstance(node, ast.comprehension):
        return 1 + len(node.ifs)
    return 0


def own_decisions(func: ast.AST) -> int:
    """A function's decision points, without those of the functions and classes defined inside it."""
    total, todo = 0, list(ast.iter_child_nodes(func))
    while todo:
        node = todo.pop()
        if isinstance(node, SCOPES):
            continue
        total += decisions(node)
        todo.extend(ast.iter_child_nodes(node))
    return total


def docstring_lines(tree: ast.AST) -> list[str]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (*FUNCS, ast.ClassDef)))]
    return [line for n in nodes if (doc := ast.get_docstring(n, clean=False)) for line in doc.splitlines()]


def scan_file(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    code, comments = set(), []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments.append(tok.string)
        elif tok.type not in SKIP_TOKENS:
            code.update(range(tok.start[0], tok.end[0] + 1))
    lines = text.splitlines()
    funcs = [(f"{path.relative_to(ROOT)}:{n.lineno} {n.name}", own_decisions(n), n.end_lineno - n.lineno + 1)
             for n in ast.walk(tree) if isinstance(n, FUNCS)]
    return {"code_lines": len(code), "decisions": sum(decisions(n) for n in ast.walk(tree)),
            "wide": sum(1 for i in code if len(lines[i - 1]) > 100), "funcs": funcs,
            "measurements": sum(1 for line in comments + docstring_lines(tree) if MEASUREMENT.search(line)),
            "notebook": len(NOTEBOOK.findall(text))}


def python_files(base: Path) -> list[Path]:
    return sorted(p for p in base.rglob("*.py") if ".venv" not in p.parts)


def measure(base: Path) -> dict:
    files = python_files(base)
    scans = [scan_file(p) for p in files]
    code = sum(s["code_lines"] for s in scans)
    funcs = [f for s in scans for f in s["funcs"]]
    branches = sorted(funcs, key=lambda f: -f[1])
    folders = Counter(str(p.parent.relative_to(ROOT)) for p in files)
    return {"path": str(base.relative_to(ROOT)), "files": len(files), "code_lines": code,
            "decisions_per_100": round(100 * sum(s["decisions"] for s in scans) / max(1, code), 1),
            "functions": len(funcs), "functions_15plus": sum(1 for f in funcs if f[1] >= 15),
            "functions_20plus": sum(1 for f in funcs if f[1] >= 20),
            "median_function_lines": statistics.median(f[2] for f in funcs) if funcs else 0,
            "share_over_100_cols": round(sum(s["wide"] for s in scans) / max(1, code), 3),
            "notebook_mentions": sum(s["notebook"] for s in scans),
            "measurement_comment_lines": sum(s["measurements"] for s in scans),
            "worst_functions": [{"where": f[0], "branches": f[1]} for f in branches[:15]],
            "files_per_folder": dict(folders.most_common())}


def notebook_elsewhere() -> dict:
    """session N / issue N mentions in tests and docs, and docs/benchmarks.md's length."""
    tests = sum(len(NOTEBOOK.findall(p.read_text(encoding="utf-8"))) for p in python_files(ROOT / "tests"))
    docs = sum(len(NOTEBOOK.findall(p.read_text(encoding="utf-8"))) for p in sorted((ROOT / "docs").rglob("*.md")))
    bench = ROOT / "docs" / "benchmarks.md"
    return {"notebook_mentions_tests": tests, "notebook_mentions_docs": docs,
            "benchmarks_md_lines": len(bench.read_text(encoding="utf-8").splitlines()) if bench.exists() else 0}


def print_table(results: list[dict], extra: dict) -> None:
    keys = ["files", "code_lines", "decisions_per_100", "functions", "functions_15plus", "functions_20plus",
            "median_function_lines", "share_over_100_cols", "notebook_mentions", "measurement_comment_lines"]
    print(f"{'metric':28s}" + "".join(f"{r['path'][-30:]:>32s}" for r in results))
    for key in keys:
        print(f"{key:28s}" + "".join(f"{r[key]!s:>32s}" for r in results))
    for key, value in extra.items():
        print(f"{key:28s}{value!s:>32s}")
    for r in results:
        print(f"\nworst functions by branches ({r['path']}):")
        for f in r["worst_functions"]:
            print(f"  {f['branches']:3d}  {f['where']}")
        print(f"files per folder ({r['path']}, top 12):")
        for folder, n in list(r["files_per_folder"].items())[:12]:
            print(f"  {n:3d}  {folder}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", default=["radixlm"], help="folders to measure (relative to the repo)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args()
    results = [measure((ROOT / p).resolve()) for p in args.paths]
    extra = notebook_elsewhere()
    if args.json:
        print(json.dumps({"results": results, **extra}, indent=1))
    else:
        print_table(results, extra)


if __name__ == "__main__":
    main()
