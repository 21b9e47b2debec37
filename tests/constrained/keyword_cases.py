"""Hand-written valid and invalid instances per JSON Schema keyword family.

Each case: a schema, instances that validate against it (written with properties in the schema's
order: the grammar generates them in that order) and instances that do not. Every instance is checked
against the schema with jsonschema by the test itself, so a wrong label fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Case:
    name: str
    schema: dict[str, Any]
    valid: tuple[Any, ...]
    invalid: tuple[Any, ...] = ()


OBJ_AB = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
NODE = {"type": "object", "properties": {"value": {"type": "integer"},
                                         "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"]}

ONE_SIDED = {"type": "object", "properties": {
    "timeout": {"type": "number", "minimum": 1000}, "ratio": {"type": "number", "exclusiveMinimum": 0},
    "limit": {"type": "number", "maximum": -1}, "sizes": {"type": "array", "items": {"type": "number", "minimum": 0}}}}

CASES = [
    # annotations and unknown keywords are ignored
    Case("annotations", {"$schema": "http://json-schema.org/draft-07/schema#", "$id": "https://x.org/s.json",
                         "title": "T", "description": "d", "$comment": "c", "examples": [{}], "default": {},
                         "deprecated": True, "readOnly": True, "fileMatch": ["*.x"], "x-custom": 1,
                         "type": "object", "properties": {"a": {"type": "integer", "title": "A", "default": 1}},
                         "required": ["a"]},
         ({"a": 1}, {"a": -20}), ({}, {"a": "1"}, {"a": 1.5}, [])),
    Case("draft4_id", {"id": "http://x.org/s#", "$schema": "http://json-schema.org/draft-04/schema#",
                       "type": "string", "maxLength": 3}, ("", "abc"), ("abcd", 1)),
    # allOf merged
    Case("allof_merge", {"type": "object", "properties": {"a": {"type": "integer"}},
                         "allOf": [{"required": ["a"]}, {"properties": {"a": {"minimum": 0, "maximum": 9}}}]},
         ({"a": 0}, {"a": 9}), ({}, {"a": 10}, {"a": -1})),
    Case("allof_types", {"allOf": [{"type": ["integer", "string"]}, {"type": ["number", "null"]}]},
         (1, 0, -5), ("a", None, 1.5)),
    Case("allof_strings", {"allOf": [{"type": "string", "minLength": 2}, {"maxLength": 3}]},
         ("ab", "abc"), ("a", "abcd", 12)),
    # anyOf / oneOf with siblings
    Case("anyof_siblings", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                            "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
         ({"a": 1}, {"b": "x"}, {"a": 1, "b": "x"}), ({},)),
    Case("oneof_disjoint", {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
         (3, "ab"), ("abc", None, [])),
    Case("oneof_tagged", {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind", "x"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind", "y"]}]},
         ({"kind": "a", "x": 1}, {"kind": "b", "y": "s"}), ({"kind": "a", "y": "s"}, {"kind": "c", "x": 1})),
    Case("oneof_overlap", {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 10}]},
         (5, 10.5), ("x",)),
    Case("oneof_required_xor", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
         ({"a": 1}, {"b": 2}), ({}, {"a": 1, "b": 2})),
    Case("oneof_refs_forbidden_key", {
        "$defs": {"ref": {"type": "object", "properties": {"$ref": {"type": "string"}}, "required": ["$ref"],
                          "additionalProperties": False},
                  "item": {"type": "object", "properties": {"name": {"type": "string"}},
                           "patternProperties": {"^x-": {}}, "additionalProperties": False}},
        "oneOf": [{"$ref": "#/$defs/ref"}, {"$ref": "#/$defs/item"}]},
         ({"$ref": "#/a"}, {"name": "n"}, {}), ({"$ref": "#/a", "name": "n"}, {"name": 1})),
    Case("oneof_const_tag_untyped", {"oneOf": [{"properties": {"t": {"const": "a"}}, "required": ["t"]},
                                               {"properties": {"t": {"const": "b"}}, "required": ["t"]}]},
         ({"t": "a"}, {"t": "b"}), ({"t": "c"}, 3)),  # 3 matches both: enforced as anyOf (reported)
    # if / then / else
    Case("if_then_else", {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
                          "required": ["kind"],
                          "if": {"properties": {"kind": {"const": "a"}}},
                          "then": {"required": ["n"]}, "else": {"properties": {"n": {"maximum": 0}}}},
         ({"kind": "a", "n": 5}, {"kind": "b"}, {"kind": "b", "n": -1}),
         ({"kind": "a"}, {"kind": "b", "n": 3})),
    # untyped conditions hold for every non-object: conflicting consts only rule out objects
    Case("if_then_untyped_allof", {"allOf": [
        {"if": {"properties": {"t": {"const": "a"}}, "required": ["t"]}, "then": {"required": ["n"]}},
        {"if": {"properties": {"t": {"const": "b"}}, "required": ["t"]}, "then": {"required": ["m"]}}]},
         ("", 3, None, [], {}, {"t": "a", "n": 1}, {"t": "b", "m": 1}), ({"t": "a"}, {"t": "b"})),
    # not
    Case("not_type", {"not": {"type": ["string", "null"]}}, (1, True, [], {}), ("a", None)),
    Case("not_enum", {"type": "string", "enum": ["a", "b", "c"], "not": {"enum": ["b"]}}, ("a", "c"), ("b", "d")),
    Case("not_required", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "not": {"required": ["b"]}}, ({}, {"a": 1}), ({"b": 1}, {"a": 1, "b": 2})),
    Case("not_two_keywords", {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
                              "required": ["k"],
                              "not": {"properties": {"k": {"const": "a"}}, "required": ["n"]}},
         ({"k": "a"}, {"k": "b", "n": 1}), ({"k": "a", "n": 1},)),
    Case("not_required_untyped", {"not": {"required": ["b"]}}, ({}, {"a": 1}), ({"b": 1}, 3, "s", None)),
    # object keywords
    Case("pattern_properties", {"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
                                "additionalProperties": False},
         ({}, {"x-a": 1, "x-b": 2}), ({"y": 1}, {"x-a": "s"})),
    Case("additional_schema", {"type": "object", "additionalProperties": {"type": "integer"}},
         ({}, {"k": 1, "j": 2}), ({"k": "v"}, [])),
    Case("additional_false", {"type": "object", "properties": {"a": {"type": "boolean"}},
                              "additionalProperties": False}, ({}, {"a": True}), ({"a": 1},)),
    Case("property_names", {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
                            "additionalProperties": {"type": "integer"}},
         ({}, {"ab": 1}), ({"A1": 1},)),
    Case("dependent_required", {**OBJ_AB, "dependentRequired": {"a": ["b"]}},
         ({}, {"b": "x"}, {"a": 1, "b": "x"}), ({"a": 1},)),
    Case("dependencies_draft7", {**OBJ_AB, "$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": ["b"], "b": {"required": ["a"]}}},
         ({}, {"a": 1, "b": "x"}), ({"a": 1}, {"b": "x"})),
    Case("dependent_schemas", {**OBJ_AB, "dependentSchemas": {"a": {"properties": {"b": {"maxLength": 1}}}}},
         ({"b": "long"}, {"a": 1, "b": "x"}), ({"a": 1, "b": "xy"},)),
    Case("min_max_properties", {"type": "object", "additionalProperties": {"type": "integer"},
                                "minProperties": 1, "maxProperties": 2},
         ({"a": 1}, {"a": 1, "b": 2}), ({}, {"a": 1, "b": 2, "c": 3})),
    Case("required_unlisted", {"type": "object", "required": ["id"], "additionalProperties": {"type": "string"}},
         ({"id": "x"},), ({}, {"id": 1})),
    # arrays
    Case("prefix_items", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                          "items": {"type": "boolean"}},
         ([], [1], [1, "a"], [1, "a", True, False]), (["a"], [1, 2], [1, "a", 3])),
    Case("tuple_items_draft4", {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array", "items": [{"type": "integer"}, {"type": "null"}],
                                "additionalItems": False, "minItems": 1},
         ([1], [1, None]), ([], [1, None, 2], [None])),
    Case("items_bounds", {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
         ([1], [1, 2, 3]), ([], [1, 2, 3, 4], ["a"])),
    Case("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}},
         ([10], [1, 20]), ([], [1, 2])),
    Case("unique_items", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
         ([], [1, 2]), ([1, 1],)),
    # const / enum of any JSON value
    Case("const_object", {"const": {"a": [1, {"b": None}]}}, ({"a": [1, {"b": None}]},), ({"a": [1]}, 1)),
    Case("enum_mixed", {"enum": [1, "a", None, [1, 2], {"k": True}]},
         (1, "a", None, [1, 2], {"k": True}), (2, "b", [1], {"k": False})),
    # numbers
    Case("multiple_of", {"type": "integer", "multipleOf": 3}, (0, 3, -9, 300), (1, 5, 2.5)),
    Case("exclusive_draft4", {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
                              "minimum": 0, "exclusiveMinimum": True, "maximum": 5, "exclusiveMaximum": True},
         (1, 4), (0, 5, -1)),
    Case("exclusive_numbers", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
         (0.5, 9.99, 1), (0, 10, -1)),
    Case("fractional_bounds", {"type": "number", "minimum": 0.5, "maximum": 2.5}, (0.5, 1, 2.5), (0.4, 2.6)),
    # one-sided bounds below the root (llguidance: number_layer.py; exponent spellings in test_number_layer.py)
    Case("one_sided_bounds", ONE_SIDED,
         ({"timeout": 1000, "ratio": 0.5, "limit": -1, "sizes": []}, {"timeout": 1500.5, "sizes": [0, 2, 0.25]}),
         ({"timeout": 999.99}, {"timeout": 100.0}, {"timeout": -1e300}, {"ratio": 0}, {"ratio": -0.0},
          {"ratio": -1e-9}, {"limit": -0.5}, {"limit": 1e300}, {"limit": 0}, {"sizes": [1, -1e-300]},
          {"sizes": [-0.5]})),
    # $ref
    Case("ref_siblings", {"$defs": {"s": {"type": "string"}}, "type": "object",
                          "properties": {"a": {"$ref": "#/$defs/s", "minLength": 2}}, "required": ["a"]},
         ({"a": "ab"},), ({"a": "a"}, {"a": 1})),
    Case("ref_own_id", {"$id": "https://example.com/root.json", "$defs": {"n": {"type": "integer"}},
                        "type": "array", "items": {"$ref": "https://example.com/root.json#/$defs/n"}},
         ([], [1, 2]), (["a"],)),
    Case("ref_anchor", {"$defs": {"s": {"$anchor": "short", "type": "string", "maxLength": 2}},
                        "type": "array", "items": {"$ref": "#short"}}, (["ab"],), (["abc"],)),
    Case("pointer_escapes", {"definitions": {"a/b": {"type": "integer"}, "c~d": {"type": "string"},
                                             "e f": {"type": "boolean"}},
                             "type": "array", "prefixItems": [{"$ref": "#/definitions/a~1b"},
                                                              {"$ref": "#/definitions/c~0d"},
                                                              {"$ref": "#/definitions/e%20f"}],
                             "items": False},
         ([1, "x", True],), (["x"], [1, "x", True, 1])),
    Case("recursive_tree", {"$defs": {"node": NODE}, "$ref": "#/$defs/node"},
         ({"value": 1}, {"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]}),
         ({}, {"value": 1, "children": [{}]})),
    Case("recursive_list", {"$defs": {"l": {"type": ["object", "null"], "properties": {
        "head": {"type": "integer"}, "tail": {"$ref": "#/$defs/l"}}, "required": ["head", "tail"]}},
        "$ref": "#/$defs/l"},
         (None, {"head": 1, "tail": None}, {"head": 1, "tail": {"head": 2, "tail": None}}),
         ({"head": 1}, {"head": 1, "tail": 3})),
    # strings
    Case("pattern_ecma", {"type": "string", "pattern": "^\\d{3}-\\w+$"}, ("123-ab_c",), ("12-ab", "123-", "a")),
    Case("pattern_unanchored", {"type": "string", "pattern": "ab"}, ("ab", "xaby"), ("ba", "")),
    Case("pattern_escapes", {"type": "string", "pattern": "^[\\w.\\-]+@[a-z]+\\.(com|org)$"},
         ("a.b@x.com", "z-1@q.org"), ("a@b.net", "@x.com")),
    Case("pattern_lookahead", {"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]{3,}$"},
         ("ab1", "1234"), ("ab", "AB1")),
    Case("pattern_unicode", {"type": "string", "pattern": "^\\p{L}+$"}, ("abc", "été"), ("a1", "")),
    Case("format_date", {"type": "string", "format": "date"}, ("2024-02-29", "1999-12-31"), ("2023-02-29", "x")),
    Case("format_unknown", {"type": "string", "format": "x-color"}, ("red", ""), (1,)),
    Case("string_lengths", {"type": "string", "minLength": 1, "maxLength": 2}, ("a", "ab"), ("", "abc")),
    Case("type_list", {"type": ["string", "null"], "maxLength": 2}, ("ab", None), ("abc", 1)),
    Case("free_form", {}, (1, "a", None, True, [1, "b"], {"k": 2}), ()),
]
