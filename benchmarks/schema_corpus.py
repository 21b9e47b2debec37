"""The real-world JSON-schema corpus (tests/data/real_schemas/): load it, validate against it, and put its
schemas and valid instances through a grammar backend. Used by tests/constrained/test_real_schemas.py and
`bench_grammar.py --corpus` (any process; nothing here starts a model).

Instances are serialized the way the grammars expect a document: an object's keys in the order of its
schema's `properties` (then the rest), `", "` / `": "` separators by default, none in compact style.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from benchmarks.schema_order import serialize

CORPUS_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "real_schemas"


@dataclass(frozen=True)
class CorpusSchema:
    name: str               # "<source>/<file>.json", the key in manifest.json and instances.json
    text: str               # the file as the package ships it (what a user would send)
    schema: Any
    info: dict              # the manifest entry: package, version, path, license, bytes, draft
    instances: tuple = ()   # valid instances (hypothesis-jsonschema, checked with jsonschema)


def load_corpus(names: Iterable[str] | None = None) -> list[CorpusSchema]:
    manifest = json.loads((CORPUS_DIR / "manifest.json").read_text())["schemas"]
    path = CORPUS_DIR / "instances.json"
    instances = json.loads(path.read_text())["instances"] if path.exists() else {}
    out = []
    for name in sorted(manifest) if names is None else names:
        text = (CORPUS_DIR / name).read_text(encoding="utf-8")
        out.append(CorpusSchema(name, text, json.loads(text), manifest[name], tuple(instances.get(name, ()))))
    return out


def not_generated() -> dict[str, str]:
    """Schemas hypothesis-jsonschema made no valid instance for, and why."""
    return json.loads((CORPUS_DIR / "instances.json").read_text())["not_generated"]


# ---- validation -------------------------------------------------------------------------------------

def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterable[Any]:
    """`pattern` as ECMA-262 (what the spec says), so `\\p{L}` and friends work; Python's re otherwise."""
    from jsonschema.exceptions import ValidationError

    if not isinstance(instance, str):
        return
    try:
        import regress

        found = regress.Regex(pattern, "u").find(instance) is not None
    except Exception:  # noqa: BLE001 - regress missing or refusing: fall back to Python's re
        try:
            found = re.search(pattern, instance) is not None
        except re.error:  # an ECMA-262 pattern Python's re refuses: not checked here
            return
    if not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def validator_for(schema: Any, formats: bool = False) -> Any:
    """A jsonschema validator under the schema's own draft (draft 7 when it names none)."""
    import jsonschema

    from radixlm.constrained.schema_refs import rebase_bundled_refs

    draft = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    # A bundled schema's refs read against its root where its own resources lack them, as the grammar does.
    schema = rebase_bundled_refs(schema, "id" if draft is jsonschema.Draft4Validator else "$id")
    cls = jsonschema.validators.extend(draft, {"pattern": _ecma_pattern})
    return cls(schema, format_checker=cls.FORMAT_CHECKER if formats else None)


def output_errors(validator: Any, text: str) -> list[str]:
    """Why a finished output is not a valid document ([] when it is)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        return [f"not JSON: {e}"]
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(value)]




# ---- through a grammar backend ----------------------------------------------------------------------

GENERIC_FAILURE = "grammar could not be compiled"  # the worker's message for an exception it hid


@dataclass
class Compiled:
    """One schema's compile: the grammar, or the GrammarError that refused it; seconds is wall time from
    submit to result, loading the worker's bytes included (its own compile time only in sequential runs)."""

    name: str
    grammar: Any = None
    error: Any = None
    seconds: float = 0.0


def spec_text(item: CorpusSchema) -> str:
    """What reaches the grammar: the schema re-serialized as the OpenAI route does (json.dumps)."""
    return json.dumps(item.schema)


def compile_corpus(backend: Any, corpus: list[CorpusSchema], timeout_s: float = 5.0, workers: int = 2,
                   sequential: bool = False) -> dict[str, Compiled]:
    """Every schema through a GrammarCache (killable workers, the serving compile limit), as the server
    compiles them; sequential=True submits one at a time so each compile is timed alone."""
    from radixlm.constrained import GrammarError
    from radixlm.constrained.cache import GrammarCache, GrammarCacheConfig

    config = GrammarCacheConfig(num_workers=1 if sequential else workers, compile_timeout_s=timeout_s,
                                max_entries=len(corpus) + 1)
    out: dict[str, Compiled] = {}
    done: dict[str, float] = {}  # completion times, taken by the dispatcher thread as each ends
    with GrammarCache(backend, config) as cache:
        pending: list[tuple[CorpusSchema, Future, float]] = []
        for item in corpus:
            fut = cache.submit("json_schema", spec_text(item))
            fut.add_done_callback(lambda _, name=item.name: done.setdefault(name, time.perf_counter()))
            pending.append((item, fut, time.perf_counter()))
            if sequential:
                fut.exception()
        for item, fut, start in pending:
            result = Compiled(item.name)
            try:
                result.grammar = fut.result()
            except GrammarError as e:
                result.error = e
            result.seconds = done.get(item.name, time.perf_counter()) - start
            out[item.name] = result
    return out


def refusal_reason(error: Any) -> str:
    """A refusal message with its specifics (names, numbers, paths) cut, to count reasons."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\d+(\.\d+)?", "…", error.message)
    return f"{error.code}: {text[:120]}"


def token_ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def feed(matcher: Any, ids: list[int]) -> int:
    """Feed ids; -1 when every token was taken and the text is complete, else the index of the first
    refused token (len(ids) when all were taken but the matcher does not accept the end)."""
    for i, t in enumerate(ids):
        if not matcher.accept_token(t):
            return i
    return -1 if matcher.is_accepting() else len(ids)


UNREPRESENTABLE = -2  # InstanceCheck.refused_at of a text the tokenizer cannot encode (no model writes it)


@dataclass
class InstanceCheck:
    name: str
    text: str
    refused_at: int          # -1: accepted; UNREPRESENTABLE; else the index of the refused token
    context: str = field(default="")  # the text around the refused token

    @property
    def judged(self) -> bool:
        return self.refused_at != UNREPRESENTABLE


def check_instances(grammar: Any, tokenizer: Any, item: CorpusSchema, compact: bool = False) -> list[InstanceCheck]:
    """Each stored valid instance, serialized and tokenized, through a fresh matcher."""
    out = []
    for value in item.instances:
        text = serialize(value, item.schema, compact)
        ids = token_ids(tokenizer, text)
        if tokenizer.decode(ids) != text:  # e.g. SmolLM2 has no token for some UTF-8 lead bytes
            out.append(InstanceCheck(item.name, text, UNREPRESENTABLE))
            continue
        at = feed(grammar.matcher(), ids)
        context = ""
        if at >= 0:
            done = len(tokenizer.decode(ids[:at]))
            context = f"...{text[max(0, done - 40):done]}<<{text[done:done + 20]}"
        out.append(InstanceCheck(item.name, text, at, context))
    return out
