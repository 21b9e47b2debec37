"""oneOf exclusivity proofs (schema_disjoint.py) on lowered schemas: what it proves, and that it stays
conservative (never "disjoint" where a value matches both; each such claim is checked with a witness)."""

from __future__ import annotations

import jsonschema
import pytest

from radixlm.constrained.schema_disjoint import Memo, apart, disjoint, excludes

NEVER = {"not": {}}
OBJ = ["object"]

DEFS = {
    "ref": {"type": OBJ, "required": ["$ref"], "properties": {"$ref": {"type": ["string"]}}},
    "item": {"type": OBJ, "properties": {"name": {"type": ["string"]}}, "patternProperties": {"^x-": {}},
             "additionalProperties": NEVER},
    "tree": {"type": OBJ, "required": ["kind"], "properties": {"kind": {"enum": ["tree"]},
                                                               "child": {"$ref": "#/$defs/tree"}}},
    "leaf": {"type": OBJ, "required": ["kind"], "properties": {"kind": {"enum": ["leaf"]}}},
}


def deref(ref: str):
    return DEFS.get(ref.rsplit("/", 1)[-1])


@pytest.mark.parametrize("a, b", [
    ({"type": ["string"]}, {"type": ["integer"]}),
    ({"type": ["boolean"]}, {"enum": ["error", "warning"]}),
    ({"enum": [1, 2]}, {"enum": [3]}),
    ({"type": ["integer"], "maximum": 0}, {"type": ["number"], "minimum": 1}),
    ({"type": ["string"], "maxLength": 2}, {"type": ["string"], "minLength": 3}),
    ({"$ref": "#/$defs/ref"}, {"$ref": "#/$defs/item"}),       # `$ref` required, forbidden by the other
    ({"$ref": "#/$defs/tree"}, {"$ref": "#/$defs/leaf"}),      # const tags, one side recursive
    ({"type": OBJ, "required": ["a"], "properties": {"a": {"type": ["string"]}}},
     {"type": OBJ, "properties": {"a": {"type": ["integer"]}}}),
    ({"type": ["array"], "minItems": 1, "prefixItems": [{"enum": ["x"]}]},
     {"type": ["array"], "items": {"type": ["integer"]}}),
    ({"anyOf": [{"type": ["string"]}, {"type": ["null"]}]}, {"type": ["integer"]}),
])
def test_proved_apart(a, b):
    assert apart(a, b, deref) and apart(b, a, deref)


@pytest.mark.parametrize("a, b, witness", [
    ({"required": ["a"]}, {"required": ["b"]}, {"a": 1, "b": 2}),
    ({"type": ["integer"]}, {"type": ["number"], "minimum": 10}, 11),
    ({"properties": {"t": {"enum": ["a"]}}}, {"properties": {"t": {"enum": ["b"]}}}, 3),  # untyped: 3 fits both
    ({"type": OBJ, "required": ["$ref"]}, {"type": OBJ, "patternProperties": {"ref": {}},
                                            "additionalProperties": NEVER}, {"$ref": "x"}),
    ({"$ref": "#/$defs/missing"}, {"type": ["string"]}, "s"),  # unknown definition: not proved
    ({"type": ["string"], "pattern": "^a"}, {"type": ["string"], "pattern": "^b"}, None),  # patterns: not evaluated
])
def test_not_claimed_apart(a, b, witness):
    assert not apart(a, b, deref)
    if witness is not None:  # the pair really overlaps: a value valid against both
        for node in (a, b):
            if "$ref" not in node:
                assert jsonschema.Draft202012Validator(node).is_valid(witness), (node, witness)


def test_excludes_values():
    node = {"type": OBJ, "required": ["k"], "properties": {"k": {"enum": ["a"]}}, "additionalProperties": NEVER}
    assert excludes(node, {"k": "b"}, deref)
    assert excludes(node, {"k": "a", "other": 1}, deref)
    assert excludes(node, "string", deref)
    assert not excludes(node, {"k": "a"}, deref)
    assert not excludes({"type": ["number"], "minimum": 0}, 0.5, deref)
    assert excludes({"type": ["integer"]}, 0.5, deref)


def test_oneof_disjoint_with_memo_on_recursive_defs():
    memo = Memo(deref)
    branches = [{"$ref": "#/$defs/tree"}, {"$ref": "#/$defs/leaf"}, {"type": ["string"]}]
    assert disjoint(branches, memo) and disjoint(branches, memo)
    assert memo.memo[("#/$defs/tree", "#/$defs/leaf")] is True
    assert not disjoint([{"$ref": "#/$defs/tree"}, {"type": OBJ}], memo)
