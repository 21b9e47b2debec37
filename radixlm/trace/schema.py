"""ProgramTrace: one program run (or a run_batch) as msgspec Structs, JSON on the wire and in files.

States are the program's text holders: a run's state, each run_batch item's, each fork branch's. A branch
stores only the text it added after the fork (`parent`, `fork_pos`), so a shared prefix is stored once per
root. A call's prompt is its state's full text up to `prompt_end` and its output the text up to
`output_end` (character offsets into the state's full text: the parent's text up to fork_pos, then its own).
"""

from __future__ import annotations

from typing import Optional

import msgspec

MAX_STATE_CHARS = 50_000  # a state's own text is cut beyond this (the offsets still count the whole)
MAX_CALLS = 20_000
MAX_STATES = 20_000


class TraceState(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    id: str
    text: str = ""  # the text this state added (after fork_pos, for a branch)
    parent: Optional[str] = None
    fork_pos: int = 0  # chars of the parent's full text the branch started from
    item: Optional[int] = None  # run_batch: the item's index
    truncated: bool = False


class TraceCall(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    kind: str  # gen | select | fork | commit | join
    state: str
    start: float  # seconds since the trace started
    end: float
    name: Optional[str] = None  # the variable a gen/select writes
    prompt_end: int = 0
    output_end: int = 0
    prompt_tokens: Optional[int] = None
    cached_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    finish: Optional[str] = None
    error: Optional[str] = None
    children: list[str] = []  # fork: the branches' state ids


class ProgramTrace(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    name: str
    id: str
    started_at: float  # unix time
    duration: float
    backend: str = ""
    states: list[TraceState] = []
    calls: list[TraceCall] = []
    dropped_calls: int = 0  # calls past MAX_CALLS, counted but not kept (a very large run_batch)


def encode_trace(trace: ProgramTrace) -> bytes:
    return msgspec.json.encode(trace)


def decode_trace(data: bytes | str) -> ProgramTrace:
    """Raises msgspec.ValidationError / DecodeError on a malformed trace, ValueError when it is too big."""
    trace = msgspec.json.decode(data, type=ProgramTrace)
    if len(trace.calls) > MAX_CALLS or len(trace.states) > MAX_STATES:
        raise ValueError(f"a trace holds at most {MAX_CALLS} calls and {MAX_STATES} states")
    return trace


def summary(trace: ProgramTrace) -> dict:
    """The list view's line: name, time, calls, tokens."""
    gens = [c for c in trace.calls if c.kind in ("gen", "select")]
    prompt = sum(c.prompt_tokens or 0 for c in gens)
    cached = sum(c.cached_tokens or 0 for c in gens)
    return {"id": trace.id, "name": trace.name, "started_at": trace.started_at, "duration": trace.duration,
            "num_calls": len(gens), "num_states": len(trace.states), "prompt_tokens": prompt,
            "cached_tokens": cached, "completion_tokens": sum(c.completion_tokens or 0 for c in gens)}
