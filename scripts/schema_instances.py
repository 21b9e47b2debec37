"""Valid instances for the real-schema corpus (run by collect_schemas.py; needs hypothesis-jsonschema).

Each schema gets up to N distinct instances drawn by hypothesis-jsonschema with a fixed seed (the
shortest, the median and the longest serialization of what it drew), each checked with jsonschema under
the schema's own draft, formats included. A schema it cannot generate for (an unsupported keyword, a
pattern Python's re refuses, a timeout) is recorded under "not_generated" with the reason: no instance is
made up for it.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

SECONDS_PER_SCHEMA = 20
EXAMPLES = 25


class _Timeout(BaseException):  # not an Exception: hypothesis must not catch it as a failure
    pass


def _alarm(signum, frame):  # noqa: ARG001 - signal handler signature
    signal.alarm(1)  # raised inside a gc callback the exception is swallowed: then it fires again
    raise _Timeout()


def _draw(schema: dict, count: int) -> list[Any]:
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis_jsonschema import from_schema

    drawn: list[Any] = []

    @seed(0)
    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(from_schema(schema))
    def collect(value: Any) -> None:
        drawn.append(value)

    collect()
    distinct = {json.dumps(v, sort_keys=True): v for v in drawn}
    ordered = sorted(distinct.values(), key=lambda v: (len(json.dumps(v)), json.dumps(v, sort_keys=True)))
    if len(ordered) <= count:
        return ordered
    picks = [ordered[round(i * (len(ordered) - 1) / (count - 1))] for i in range(count)] if count > 1 else ordered[:1]
    return picks


def _valid(schema: dict, value: Any) -> bool:
    """The check the tests make (benchmarks/schema_corpus.py): the schema's draft, formats, ECMA patterns."""
    from benchmarks.schema_corpus import validator_for

    try:
        return validator_for(schema, formats=True).is_valid(value)
    except Exception:  # noqa: BLE001 - a keyword the validator cannot evaluate: the instance is not proven
        return False


def instances_for(job: tuple[str, str, int]) -> tuple[str, list[Any] | None, str]:
    """(name, instances or None, why none) for one schema file; runs in a worker process."""
    name, path, count = job
    schema = json.loads(Path(path).read_text())
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS_PER_SCHEMA)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = _draw(schema, count)
    except _Timeout:
        return name, None, f"timeout ({SECONDS_PER_SCHEMA} s)"
    except Exception as e:  # noqa: BLE001 - hypothesis-jsonschema refuses many keywords in many ways
        return name, None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    finally:
        signal.alarm(0)
    good = [v for v in values if _valid(schema, v)]
    if not good:
        return name, None, "no drawn instance validated" if values else "nothing drawn"
    return name, good, ""


def write_instances(out: Path, count: int, workers: int = 2, cache: Path | None = None) -> None:
    """instances.json for the corpus in `out`; results so far are kept in `cache` (a JSON-lines file keyed
    by file name and content hash), so an interrupted run resumes where it stopped."""
    manifest = json.loads((out / "manifest.json").read_text())
    done: dict[str, dict] = {}
    if cache is not None and cache.exists():
        for line in cache.read_text().splitlines():
            row = json.loads(line)
            done[row["key"]] = row
    keys = {name: f"{name}:{count}:{hashlib.sha256((out / name).read_bytes()).hexdigest()[:16]}"
            for name in sorted(manifest["schemas"])}
    jobs = [(name, str(out / name), count) for name in keys if keys[name] not in done]
    with ProcessPoolExecutor(workers) as pool, open(cache or "/dev/null", "a") as log:
        futures = [pool.submit(instances_for, job) for job in jobs]
        for fut in as_completed(futures):
            name, values, why = fut.result()
            row = {"key": keys[name], "values": values, "why": why}
            done[row["key"]] = row
            log.write(json.dumps(row, ensure_ascii=False) + "\n")
            log.flush()
            print(f"{name}: {len(values) if values else why}", file=sys.stderr)
    result: dict[str, Any] = {"instances": {}, "not_generated": {}}
    for name, key in keys.items():
        row = done[key]
        if row["values"] is None:
            result["not_generated"][name] = row["why"]
        else:
            result["instances"][name] = row["values"]
    (out / "instances.json").write_text(json.dumps(result, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
