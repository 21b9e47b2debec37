"""SGLang's `structural_tag` constraint -> llguidance Lark text (the `ebnf` kind).

Runs wherever SamplingParams are normalized (pure text building; no tokenizer: each structure's schema is
lowered by the compile worker, under its deadline, see deferred_json.py). The shape:
`{"type": "structural_tag", "structures": [{"begin", "schema", "end"}], "triggers": [...]}`: free text, and
once a trigger appears the text must continue as one of the structures whose `begin` starts with it (the
rest of `begin`, a JSON value matching `schema`, then `end`), after which free text resumes. Triggers are
llguidance lazy lexemes: the free text ends at a trigger's first occurrence. Needs the llguidance backend.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.deferred_json import deferred
from radixlm.constrained.errors import INVALID_GRAMMAR, GrammarError

PARAM = "structural_tag"


def _fail(message: str) -> GrammarError:
    return GrammarError(PARAM, INVALID_GRAMMAR, message)


def _load(spec: Any) -> tuple[list[dict[str, Any]], list[str]]:
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            raise _fail("must be a JSON object") from None
    if not isinstance(spec, dict) or spec.get("type", "structural_tag") != "structural_tag":
        raise _fail('must be {"type": "structural_tag", "structures": [...], "triggers": [...]}')
    structures, triggers = spec.get("structures"), spec.get("triggers")
    if not isinstance(structures, list) or not structures or not isinstance(triggers, list) or not triggers:
        raise _fail("structures and triggers must be non-empty lists")
    for s in structures:
        if not (isinstance(s, dict) and isinstance(s.get("begin"), str) and isinstance(s.get("end"), str)
                and isinstance(s.get("schema", {}), dict)):
            raise _fail("each structure needs begin (string), schema (object) and end (string)")
    if not all(isinstance(t, str) and t for t in triggers):
        raise _fail("triggers must be non-empty strings")
    return structures, triggers


def structural_tag_to_lark(spec: Any) -> str:
    structures, triggers = _load(spec)
    lines, tags = ["%llguidance {}"], []
    for t, trigger in enumerate(triggers):
        bodies = []
        for s, st in enumerate(structures):
            if not st["begin"].startswith(trigger):
                continue
            rest = st["begin"][len(trigger):]
            parts = [json.dumps(rest) if rest else "", deferred(st.get("schema", {}), PARAM, f"structure {s}: "),
                     json.dumps(st["end"]) if st["end"] else ""]
            lines.append(f"body_{t}_{s}: " + " ".join(p for p in parts if p))
            bodies.append(f"body_{t}_{s}")
        if not bodies:
            raise _fail(f"trigger {trigger[:40]!r} starts no structure's begin")
        lines += [f"trigger_{t}[lazy]: TEXT {json.dumps(trigger)}", f"tag_{t}: trigger_{t} ({' | '.join(bodies)})"]
        tags.append(f"tag_{t}")
    lines += [f"start: ({' | '.join(tags)})* TEXT", r"TEXT: /(.|\n)*/"]
    return "\n".join(lines) + "\n"
