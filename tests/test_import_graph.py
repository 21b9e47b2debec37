"""Imports run downward only: a static (ast) read of every import in a module, lazy ones inside functions
included, so a layer cannot reach up into the one that drives it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG_ROOT = Path(__file__).resolve().parents[1] / "radixlm"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path = PKG_ROOT.parent) -> set[str]:
    """Every module an `import` / `from ... import` anywhere in the file names (relative ones resolved);
    root: the folder holding the top-level package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            out.add(str(node.args[0].value))
    return out


def _offenders(folder: str, forbidden: str) -> list[str]:
    files = sorted((PKG_ROOT / folder).rglob("*.py")) if (PKG_ROOT / folder).is_dir() else [PKG_ROOT / folder]
    assert files, folder
    return [f"{f.relative_to(PKG_ROOT.parent)} imports {m}" for f in files for m in sorted(imported_modules(f))
            if m == forbidden or m.startswith(forbidden + ".")]


@pytest.mark.parametrize("folder, forbidden", [
    ("runtime/model", "radixlm.runtime.scheduler"),  # the scheduler drives the model, never the reverse
    ("lang", "radixlm.runtime"),  # the frontend reaches a runtime only through a backend's wire
    ("runtime/forward.py", "radixlm.runtime.scheduler"),  # the neutral types sit below both
    ("runtime/forward.py", "radixlm.runtime.model"),
    ("runtime/sampling", "radixlm.runtime.scheduler"),
    ("runtime", "radixlm.router"),  # a replica shares the routing policy (radix_cache/routing.py), not the router
    ("router", "radixlm.runtime"),
    ("constrained", "radixlm.lang"),
    ("tools", "radixlm.runtime"),  # tool calling is shared by server/ and lang/: below both
    ("tools", "radixlm.lang"),
    ("trace", "radixlm.runtime"),  # program traces are shared by server/ and lang/: below both
    ("trace", "radixlm.lang"),
])
def test_no_upward_imports(folder: str, forbidden: str) -> None:
    assert _offenders(folder, forbidden) == []


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The reader itself: a lazy import inside a function and a relative import are both seen."""
    pkg = tmp_path / "radixlm" / "runtime" / "model"
    pkg.mkdir(parents=True)
    probe = pkg / "probe.py"
    probe.write_text("def f():\n    from radixlm.runtime.scheduler import batch\n"
                     "def g():\n    from ..scheduler.request import Req\n"
                     "def h():\n    import importlib\n    importlib.import_module('radixlm.runtime.scheduler.loop')\n")
    found = imported_modules(probe, tmp_path)
    assert {"radixlm.runtime.scheduler", "radixlm.runtime.scheduler.request",
            "radixlm.runtime.scheduler.loop"} <= found


def test_building_the_cli_parser_imports_no_frontend_program():
    """`radixlm serve --help` must not load the showcase (a radixlm.lang program): it loads when run."""
    code = ("import sys; from radixlm.runtime.cli import build_parser; build_parser(); "
            "assert 'radixlm.showcase' not in sys.modules, 'showcase imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PKG_ROOT.parent)
