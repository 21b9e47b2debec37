"""The real-world tool corpus (tests/data/real_tools/bfcl.json, the Berkeley Function Calling Leaderboard's
function definitions): load it and turn each entry into what a client sends and what a right answer is.
Used by tests/server/tools/test_real_tools.py (any process; nothing here starts a model).

BFCL writes parameter types in Python / Java / JavaScript words (`dict`, `float`, `tuple`, `HashMap`, ...).
Its harness rewrites them into JSON Schema before calling an OpenAI-style API, by the type table of
`bfcl_eval/constants/type_mappings.py` (unknown types become `string`, a `float` gains `format: float`
and a sentence in its description), and replaces `.` in function names with `_` (OpenAI's name rule).
`openai_tools` does the same, so the requests here are the ones BFCL sends to an OpenAI-compatible server.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "real_tools" / "bfcl.json"

# BFCL's GORILLA_TO_OPENAPI table (its type words -> JSON Schema types).
JSON_TYPES = {
    "integer": "integer", "number": "number", "float": "number", "string": "string", "boolean": "boolean",
    "bool": "boolean", "array": "array", "list": "array", "dict": "object", "object": "object", "tuple": "array",
    "any": "string", "byte": "integer", "short": "integer", "long": "integer", "double": "number", "char": "string",
    "ArrayList": "array", "Array": "array", "HashMap": "object", "Hashtable": "object", "Queue": "array",
    "Stack": "array", "Any": "string", "String": "string", "Bigint": "integer",
}


@dataclass(frozen=True)
class ToolSet:
    file: str                      # the BFCL data file (its category)
    id: str                        # the entry's id
    tools: tuple[dict, ...]        # OpenAI `tools` entries, as BFCL sends them
    ground_truth: tuple = ()       # ((name, {arg: [accepted values]}), ...) in BFCL's words, names as sent


def _cast_properties(properties: dict[str, Any]) -> dict[str, Any]:
    for prop in properties.values():
        kind = prop.get("type")
        prop["type"] = JSON_TYPES.get(kind, "string") if kind is not None else "string"
        if kind == "float":
            prop["format"] = "float"
            prop["description"] = prop.get("description", "") + " This is a float type value."
        if prop["type"] in ("array", "object"):
            if "properties" in prop:
                _cast_properties(prop["properties"])
            elif isinstance(prop.get("items"), dict) and "type" in prop["items"]:
                _cast_items(prop["items"])
    return properties


def _cast_items(items: dict[str, Any]) -> None:
    """BFCL casts list items one or two levels deep (lists of lists, lists of dicts)."""
    items["type"] = JSON_TYPES.get(items["type"], "string")
    inner = items.get("items")
    if items["type"] == "array" and isinstance(inner, dict) and "type" in inner:
        inner["type"] = JSON_TYPES.get(inner["type"], "string")
    elif items["type"] == "object" and "properties" in items:
        _cast_properties(items["properties"])


def openai_name(name: str) -> str:
    return name.replace(".", "_")


def openai_tool(function: dict[str, Any]) -> dict[str, Any]:
    fn = copy.deepcopy(function)
    fn["name"] = openai_name(fn["name"])
    params = fn.setdefault("parameters", {})
    params["type"] = "object"
    params["properties"] = _cast_properties(params.get("properties", {}))
    fn.pop("response", None)  # the multi-turn docs describe results too; a tool definition has no such field
    return {"type": "function", "function": fn}


def load_tool_sets() -> list[ToolSet]:
    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
    functions = corpus["functions"]
    out = []
    for entry in corpus["sets"]:
        calls = entry.get("ground_truth", ())
        truth = tuple((openai_name(name), args) for call in calls for name, args in call.items())
        tools = tuple(openai_tool(functions[k]) for k in entry["functions"])
        out.append(ToolSet(entry["file"], entry["id"], tools, truth))
    return out


def source() -> dict[str, str]:
    return json.loads(CORPUS.read_text(encoding="utf-8"))["source"]


def answer_calls(tool_set: ToolSet) -> list[tuple[str, dict[str, Any]]] | None:
    """One right answer: each call with, per argument, the first accepted value its property's schema admits
    ("" and null in the accepted list mean it may be left out; BFCL's checker is lenient about types, so
    some listed values are not valid JSON-Schema values), or None if there is none (or the ground truth
    names a function the set lacks)."""
    import jsonschema

    params = {t["function"]["name"]: t["function"]["parameters"] for t in tool_set.tools}
    calls = []
    for name, args in tool_set.ground_truth:
        if name not in params or not isinstance(args, dict):
            return None
        chosen = {}
        for key, accepted in args.items():
            prop = params[name].get("properties", {}).get(key, {})
            accepted = accepted if isinstance(accepted, list) else []
            values = [v for v in accepted if v not in ("", None) and jsonschema.Draft202012Validator(prop).is_valid(v)]
            if values:
                chosen[key] = values[0]
            elif "" not in accepted and None not in accepted:
                return None
        calls.append((name, chosen))
    return calls or None


def unsatisfiable_property(parameters: dict[str, Any]) -> str | None:
    """A required property whose `enum` lists no value its own schema admits (BFCL has a few: an array
    whose enum lists strings, an integer whose enum lists numerals), so no arguments object is valid."""
    import jsonschema

    for name in parameters.get("required", ()):
        prop = parameters.get("properties", {}).get(name)
        if isinstance(prop, dict) and isinstance(prop.get("enum"), list):
            validator = jsonschema.Draft202012Validator(prop)
            if not any(validator.is_valid(v) for v in prop["enum"]):
                return name
    return None
