"""The real-world schema corpus (tests/data/real_schemas/, 400+ schemas from PyPI and npm packages) through
each grammar backend with the real SmolLM2 tokenizer: coverage, clear refusals, valid instances accepted,
random-walk outputs valid. The corpus itself is checked without a tokenizer."""

from __future__ import annotations

import collections
import importlib.util
import json

import pytest

from benchmarks.schema_corpus import (CORPUS_DIR, GENERIC_FAILURE, check_instances, compile_corpus, load_corpus,
                                      not_generated, output_errors, refusal_reason, spec_text, validator_for)
from radixlm.constrained import BACKENDS, GrammarError, GrammarOptions, make_backend
from radixlm.constrained.errors import ERROR_CODES
from radixlm.runtime.config import GrammarConfig

COVERAGE_MIN = 0.97              # accepted / total on the default backend
INSTANCE_ACCEPTANCE_MIN = 0.99   # valid instances the grammar takes, over the accepted schemas
MIN_SCHEMAS = 300
COMPILE_LIMIT_S = 60.0
# Measured: llguidance 476/477 (99.79%), in both whitespace styles; numbers in exponent form under a
# one-sided bound (1.79e+308 under `minimum: 0`) go through number_layer.py. Its one refusal is its own
# limit, with no option to lift it: its string lexeme excludes a raw U+007F (`\u007f` is taken).
# The other backends are held to their measured floors, below the target (docs/json_schema.md):
# outlines' string regex refuses raw C1 and escaped control characters, which hypothesis generates often.
INSTANCE_FLOORS = {"llguidance": INSTANCE_ACCEPTANCE_MIN, "xgrammar": 0.95, "outlines": 0.6}
# The default backend gets the whole corpus; the others (parametrized where cheap) an evenly spaced
# sample, so the file stays within a few minutes on 2 cores.
OTHER_BACKEND_EVERY = 8
WALKS = {"default": (16, (0, 1)), "other": (8, (0,))}  # schemas walked (evenly over the accepted), seeds
DEFAULT_BACKEND = GrammarConfig().grammar_backend
_MODULES = {"outlines": "outlines_core", "xgrammar": "xgrammar", "llguidance": "llguidance"}
AVAILABLE = [b for b in BACKENDS if importlib.util.find_spec(_MODULES.get(b, b)) is not None]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_corpus_matches_its_manifest(corpus):
    from scripts.schema_checks import draft_of, ref_problem

    manifest = json.loads((CORPUS_DIR / "manifest.json").read_text())
    assert len(corpus) >= MIN_SCHEMAS
    assert len(corpus) == len(manifest["schemas"]) == len(set(json.dumps(c.schema, sort_keys=True) for c in corpus))
    for item in corpus:
        assert (CORPUS_DIR / item.name).stat().st_size == item.info["bytes"], item.name
        assert ref_problem(item.schema) is None, item.name
        assert draft_of(item.schema) == item.info["draft"], item.name
    per_source = collections.Counter(c.info["source"] for c in corpus)
    assert max(per_source.values()) <= 60, per_source.most_common(3)


def test_stored_instances_are_valid(corpus):
    stored = sum(1 for c in corpus if c.instances)
    assert stored + len(not_generated()) == len(corpus)
    assert stored >= 0.5 * len(corpus)
    for item in corpus:
        validator = validator_for(item.schema, formats=True)
        for value in item.instances:
            assert validator.is_valid(value), item.name


@pytest.fixture(scope="module")
def tokenizer():
    from radixlm.runtime.model.loader import load_tokenizer

    return load_tokenizer(None)


_compiled: dict[str, dict] = {}


def _share(name: str, corpus: list) -> list:
    return corpus if name == DEFAULT_BACKEND else corpus[::OTHER_BACKEND_EVERY]


def compiled_for(name: str, tokenizer, corpus) -> dict:
    """The backend's share of the corpus compiled once per session (2 workers). The default backend's limit
    is generous: these tests measure what is accepted, on a machine that may be busy (compile times are
    bench_grammar's job); the other backends keep the serving limit, or outlines' timeouts take minutes."""
    if name not in _compiled:
        backend = make_backend(name, tokenizer, len(tokenizer), GrammarOptions())
        limit = COMPILE_LIMIT_S if name == DEFAULT_BACKEND else GrammarConfig().grammar_compile_timeout
        _compiled[name] = compile_corpus(backend, _share(name, corpus), timeout_s=limit)
    return _compiled[name]


def _refusals(results: dict) -> collections.Counter:
    return collections.Counter(refusal_reason(r.error) for r in results.values() if r.error is not None)


@pytest.mark.slow
def test_default_backend_coverage(tokenizer, corpus):
    results = compiled_for(DEFAULT_BACKEND, tokenizer, corpus)
    accepted = sum(1 for r in results.values() if r.grammar is not None)
    assert accepted / len(results) >= COVERAGE_MIN, (accepted, len(results), _refusals(results).most_common(10))


@pytest.mark.slow
@pytest.mark.parametrize("backend", AVAILABLE)
def test_refusals_are_clear_grammar_errors(backend, tokenizer, corpus):
    results = compiled_for(backend, tokenizer, corpus)
    hidden = []
    for item in _share(backend, corpus):
        error = results[item.name].error
        if error is None:
            continue
        assert isinstance(error, GrammarError) and error.code in ERROR_CODES and error.param == "json_schema"
        assert error.message and "Traceback" not in error.message and len(error.message) < 600, error.message
        if error.message == GENERIC_FAILURE:  # the worker hid an exception: find it in this process
            try:
                make_backend(backend, tokenizer, len(tokenizer), GrammarOptions()).compile("json_schema", spec_text(item))
            except GrammarError as e:
                hidden.append(f"{item.name}: only in the worker: {e}")
            except Exception as e:  # noqa: BLE001 - this is what the test is for
                hidden.append(f"{item.name}: {type(e).__name__}: {e}")
    assert not hidden, hidden


@pytest.mark.slow
@pytest.mark.parametrize("backend", AVAILABLE)
def test_valid_instances_are_accepted(backend, tokenizer, corpus):
    """Valid documents go through the grammar token by token. The issue's target is INSTANCE_ACCEPTANCE_MIN;
    each backend is held to its measured floor so a regression fails (see INSTANCE_FLOORS)."""
    results = compiled_for(backend, tokenizer, corpus)
    checks = [c for item in _share(backend, corpus) if results[item.name].grammar is not None
              for c in check_instances(results[item.name].grammar, tokenizer, item) if c.judged]
    refused = [f"{c.name}: {c.context}" for c in checks if c.refused_at >= 0]
    assert len(checks) >= (300 if backend == DEFAULT_BACKEND else 1)  # others: what compiled in time
    rate = 1 - len(refused) / len(checks)  # judged instances: the share depends on which compiles finished
    print(f"{backend}: {len(checks) - len(refused)}/{len(checks)} valid instances accepted ({rate:.2%})")
    assert rate >= INSTANCE_FLOORS[backend], (len(refused), len(checks), refused[:20])


@pytest.mark.slow
def test_valid_instances_are_accepted_compact(tokenizer, corpus):
    """The same valid documents written without whitespace, through the default backend compiled for
    compact JSON (in this process: llguidance compiles the corpus in seconds)."""
    backend = make_backend(DEFAULT_BACKEND, tokenizer, len(tokenizer), GrammarOptions(compact=True))
    checks = []
    for item in corpus:
        if not item.instances:
            continue
        try:
            grammar = backend.compile("json_schema", spec_text(item))
        except GrammarError:
            continue
        checks += [c for c in check_instances(grammar, tokenizer, item, compact=True) if c.judged]
    refused = [f"{c.name}: {c.context}" for c in checks if c.refused_at >= 0]
    rate = 1 - len(refused) / len(checks)
    taken = len(checks) - len(refused)
    print(f"{DEFAULT_BACKEND} compact: {taken}/{len(checks)} valid instances accepted ({rate:.2%})")
    assert len(checks) >= 300 and rate >= INSTANCE_FLOORS[DEFAULT_BACKEND], (len(refused), len(checks), refused[:20])


@pytest.mark.slow
@pytest.mark.parametrize("backend", AVAILABLE)
def test_random_walk_outputs_validate(backend, tokenizer, corpus):
    """Every finished walk output validates, except where the lowering says it approximates a keyword
    (the server validates those outputs and reports a failure); at least half of the walks finish."""
    from radixlm.constrained.schema_lower import lower_schema
    from radixlm.constrained.simulate import random_walk

    results = compiled_for(backend, tokenizer, corpus)
    accepted = [item for item in _share(backend, corpus) if results[item.name].grammar is not None]
    num_schemas, seeds = WALKS["default" if backend == DEFAULT_BACKEND else "other"]
    step = max(1, len(accepted) // num_schemas)
    finished, invalid = 0, []
    for item in accepted[::step][:num_schemas]:
        validator = validator_for(item.schema)
        exact = not lower_schema(spec_text(item), GrammarOptions(), backend).approximations
        for seed in seeds:
            walk = random_walk(results[item.name].grammar.matcher(), tokenizer, len(tokenizer), seed=seed,
                               max_tokens=200)
            if not walk.finished:
                continue
            finished += 1
            errors = output_errors(validator, walk.text)
            if errors and exact:
                invalid.append(f"{item.name} seed {seed}: {errors[0]} in {walk.text[:300]!r}")
    assert not invalid, invalid
    assert finished >= len(seeds) * min(num_schemas, len(accepted)) // 2, finished


def _feed_masked(matcher, ids: list[int], width: int) -> int:
    """Like schema_corpus.feed, but each token must also pass the step's mask (what the sampler sees)."""
    import torch

    for i, t in enumerate(ids):
        mask = torch.zeros(width, dtype=torch.bool)
        matcher.fill_allowed_mask(mask)
        if not mask[t] or not matcher.accept_token(t):
            return i
    return -1 if matcher.is_accepting() else len(ids)


@pytest.mark.slow
def test_unique_items_layer_refuses_no_valid_instance(tokenizer, corpus):
    """The corpus' valid documents under schemas with `uniqueItems`, with the mask of the layer that blocks
    repeated items (unique_items.py) at every step: it refuses nothing the default grammar takes."""
    from benchmarks.schema_corpus import serialize, token_ids
    from radixlm.constrained.unique_items import TokenTable, UniqueItemsGrammar, wants_unique_items
    from radixlm.constrained.vocabulary import token_bytes_for

    results = compiled_for(DEFAULT_BACKEND, tokenizer, corpus)
    table = TokenTable.build(token_bytes_for(tokenizer))
    walked, differ = 0, []
    for item in corpus:
        grammar = results[item.name].grammar
        if grammar is None or not item.instances or not wants_unique_items(spec_text(item)):
            continue
        guarded = UniqueItemsGrammar(grammar, item.schema, table, len(tokenizer))
        for value in item.instances:
            ids = token_ids(tokenizer, serialize(value, item.schema, False))
            plain = _feed_masked(grammar.matcher(), ids, len(tokenizer))
            walked += 1
            if _feed_masked(guarded.matcher(), ids, len(tokenizer)) != plain:
                differ.append(item.name)
    assert walked >= 40 and not differ, (walked, differ)
