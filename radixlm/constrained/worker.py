"""Compile worker: a spawn-started process that turns specs into serialized outlines-core Indexes.

Runs in its own process (started by cache.py). outlines-core builds an Index holding the GIL and may
run for a long time on a hostile spec, so it cannot run in a scheduler thread; a separate process can
also really be stopped (SIGKILL) at the deadline.

Wire format (multiprocessing Connection, send_bytes/recv_bytes only: nothing is ever unpickled):
  parent -> worker, once: JSON {"memory_bytes": int}, the backend name, options JSON, and the backend's
                          payload (outlines-core Vocabulary bytes / xgrammar TokenizerInfo JSON /
                          llguidance: JSON with the HF tokenizer's own JSON text, vocab size, EOS);
  worker -> parent, once: b"ready";
  parent -> worker, per job: JSON {"kind": str, "spec": str};
  worker -> parent, per job: JSON {"ok": true} followed by the compiled grammar bytes, or
                             JSON {"ok": false, "error": {"param", "code", "message"}}.
The grammar bytes are the library's own serialization (outlines-core: Index bincode via
Index.__reduce__ / Index.from_binary; xgrammar: CompiledGrammar.serialize_json; llguidance: the
grammar text the worker built and checked, which the scheduler side builds matchers from), produced by our
worker from a spec string, never taken from a client.
"""

from __future__ import annotations

import json
import resource
from multiprocessing.connection import Connection
from typing import Callable

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError

READY = b"ready"
TOO_LARGE_MESSAGE = "grammar needs more memory to compile than allowed"


def param_for(kind: str, spec: str = "") -> str:
    """The request field a kind's errors point at (for a grammar with deferred schemas: the field they
    came from, such as tools)."""
    if kind == "ebnf" and spec:
        from radixlm.constrained.deferred_json import deferred_param

        param = deferred_param(spec)
        if param is not None:
            return param
    return {"json_object": "response_format"}.get(kind, kind if kind in ("regex", "json_schema", "choices", "ebnf")
                                                   else "grammar")


def _compiler(backend: str) -> Callable[[str, str, GrammarOptions, bytes], bytes]:
    # A fixed table, not an import by name: the worker runs only code we chose.
    if backend == "outlines":
        from radixlm.constrained.specs import build_index_bytes

        return build_index_bytes
    if backend == "xgrammar":
        from radixlm.constrained.xgrammar_backend import compile_serialized

        return compile_serialized
    if backend == "json_check":  # finished-output checks (check_pool.py), not a grammar backend
        import jsonschema  # noqa: F401 - imported before "ready", like a backend's library
        import regress  # noqa: F401

        from radixlm.constrained.validate import check_serialized

        return check_serialized
    if backend == "llguidance":
        from radixlm.constrained.llguidance_compile import compile_serialized as compile_llguidance

        return compile_llguidance
    raise ValueError(f"unknown grammar backend {backend!r}")


def _compile(request: bytes, compile_fn: Callable[[str, str, GrammarOptions, bytes], bytes],
             options: GrammarOptions, payload: bytes) -> list[bytes]:
    kind, spec = "grammar", ""
    try:
        job = json.loads(request)
        kind, spec = str(job["kind"]), str(job["spec"])
        data = compile_fn(kind, spec, options, payload)
        return [b'{"ok": true}', data]
    except GrammarError as e:
        error = e.to_dict()
    except MemoryError:
        error = {"param": param_for(kind, spec), "code": GRAMMAR_TOO_LARGE, "message": TOO_LARGE_MESSAGE}
    except Exception:  # noqa: BLE001 - a bug or resource error must not kill the worker or leak details
        error = {"param": param_for(kind, spec), "code": INVALID_GRAMMAR,
                 "message": "grammar could not be compiled"}
    return [json.dumps({"ok": False, "error": error}).encode()]


def worker_main(conn: Connection) -> None:
    limits = json.loads(conn.recv_bytes())
    if limits.get("memory_bytes"):
        # Some regexes blow up to GBs within the time limit; outlines-core aborts the process when an
        # allocation fails, which the parent reports as grammar_too_large.
        memory = int(limits["memory_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    compile_fn = _compiler(conn.recv_bytes().decode("utf-8"))  # imports the library before "ready"
    options = GrammarOptions.from_json(conn.recv_bytes().decode("utf-8"))
    payload = conn.recv_bytes()
    conn.send_bytes(READY)
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):  # parent gone or closed the pipe: exit quietly
            return
        for message in _compile(request, compile_fn, options, payload):
            conn.send_bytes(message)


if __name__ == "__main__":  # started by cache._Worker with the inherited socket's fd
    import sys

    from radixlm.runtime.proc import set_parent_death_signal

    set_parent_death_signal()  # exit when the process that started us dies, even mid-compile
    worker_main(Connection(int(sys.argv[1])))
