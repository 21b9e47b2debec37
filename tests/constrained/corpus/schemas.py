"""The development corpus: JSON schemas and regexes that constrained decoding must always satisfy.

Used by tests/constrained/test_corpus.py (tiny tokenizer), benchmarks/bench_grammar.py and, once the
scheduler is wired, the real-model corpus proof. Every schema is one the backend must accept.
"""

from __future__ import annotations

from typing import Any

_ADDRESS = {"type": "object", "properties": {"street": {"type": "string", "maxLength": 20},
                                             "zip": {"type": "string", "pattern": "[0-9]{5}"}},
            "required": ["street", "zip"], "additionalProperties": False}

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
               "required": ["name", "age"]},
    "flat_optional": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"},
                                                       "c": {"type": "boolean"}}, "required": ["b"]},
    "all_optional": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}},
    "nested": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer"}, "address": _ADDRESS}, "required": ["id", "address"]}}, "required": ["user"]},
    "deep_nested": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"type": "object", "properties": {"d": {"type": "boolean"}},
                                               "required": ["d"]}}, "required": ["c"]}}, "required": ["b"]}},
                    "required": ["a"]},
    "array_of_strings": {"type": "array", "items": {"type": "string", "maxLength": 8}},
    "array_min_max": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    "array_exact": {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3},
    "array_min_only": {"type": "array", "items": {"type": "null"}, "minItems": 1},
    "array_of_objects": {"type": "array", "items": {"type": "object", "properties": {
        "k": {"type": "string", "maxLength": 5}, "v": {"type": "integer"}}, "required": ["k", "v"]},
        "maxItems": 3},
    "enum_strings": {"type": "string", "enum": ["red", "green", "blue"]},
    "enum_mixed": {"enum": ["a", 1, 2.5, True, None]},
    "enum_prefixes": {"enum": ["a", "ab", "abc"]},
    "const_string": {"const": "fixed value"},
    "const_in_object": {"type": "object", "properties": {"version": {"const": 2}, "kind": {"const": "doc"}},
                        "required": ["version", "kind"]},
    "integer_bounds": {"type": "integer", "minimum": 18, "maximum": 130},
    "integer_negative_bounds": {"type": "integer", "minimum": -40, "maximum": 55},
    "integer_exclusive": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000},
    "integer_min_only": {"type": "integer", "minimum": 7},
    "integer_max_only": {"type": "integer", "maximum": -3},
    "number_bounds": {"type": "number", "minimum": 0, "maximum": 1},
    "number_exclusive": {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1},
    "number_unbounded": {"type": "number"},
    "latlon": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                                "lon": {"type": "number", "minimum": -180, "maximum": 180}},
               "required": ["lat", "lon"]},
    "string_pattern": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
    "string_lengths": {"type": "string", "minLength": 2, "maxLength": 6},
    "format_date": {"type": "string", "format": "date"},
    "format_datetime": {"type": "string", "format": "date-time"},
    "format_time": {"type": "string", "format": "time"},
    "format_uuid": {"type": "string", "format": "uuid"},
    "format_email": {"type": "string", "format": "email"},
    "format_uri": {"type": "string", "format": "uri"},
    "defs_ref": {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                                      "y": {"type": "integer"}},
                                     "required": ["x", "y"]}},
                 "type": "object", "properties": {"start": {"$ref": "#/$defs/point"},
                                                  "end": {"$ref": "#/$defs/point"}}, "required": ["start", "end"]},
    "definitions_ref_chain": {"definitions": {"a": {"$ref": "#/definitions/b"}, "b": {"$ref": "#/definitions/c"},
                                              "c": {"$ref": "#/definitions/d"}, "d": {"$ref": "#/definitions/e"},
                                              "e": {"type": "string", "enum": ["leaf"]}},
                              "type": "object", "properties": {"v": {"$ref": "#/definitions/a"}},
                              "required": ["v"]},
    "anyof_scalar": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 4}]},
    "anyof_objects": {"anyOf": [
        {"type": "object", "properties": {"cat": {"const": "meow"}}, "required": ["cat"]},
        {"type": "object", "properties": {"dog": {"type": "integer", "minimum": 1, "maximum": 3}},
         "required": ["dog"]}]},
    "nullable_type_list": {"type": "object", "properties": {"note": {"type": ["string", "null"]}},
                           "required": ["note"]},
    "additional_false": {"type": "object", "properties": {"only": {"type": "boolean"}}, "required": ["only"],
                         "additionalProperties": False},
    "free_map": {"type": "object", "additionalProperties": {"type": "integer"}},
    "empty_object_only": {"type": "object", "additionalProperties": False},
    "any_object": {"type": "object"},
    "tuple_prefix_items": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3},
                                                            {"type": "integer"}, {"type": "boolean"}]},
    "allof_single": {"allOf": [{"$ref": "#/$defs/name"}], "$defs": {"name": {"type": "string", "maxLength": 6}}},
    "tool_call": {"type": "object", "properties": {
        "name": {"enum": ["get_weather", "search"]},
        "arguments": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "unit"]}},
        "required": ["name", "arguments"], "additionalProperties": False},
    "invoice": {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"},
        "date": {"type": "string", "format": "date"},
        "lines": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "object", "properties": {
            "sku": {"type": "string", "pattern": "[A-Z]{2}[0-9]{3}"},
            "qty": {"type": "integer", "minimum": 1, "maximum": 99},
            "price": {"type": "number", "minimum": 0, "maximum": 10000}}, "required": ["sku", "qty", "price"]}},
        "paid": {"type": "boolean"}}, "required": ["id", "date", "lines"]},
    "with_annotations": {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "T",
                         "description": "annotations are ignored", "type": "object",
                         "properties": {"a": {"type": "integer", "description": "d", "default": 1}},
                         "required": ["a"]},
    "boolean_or_null": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
}

REGEXES: dict[str, str] = {
    "date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    "email": r"[a-z0-9._%+-]{1,16}@[a-z0-9-]{1,12}(\.[a-z]{2,6}){1,2}",
    "phone_us": r"\+1-[0-9]{3}-[0-9]{3}-[0-9]{4}",
    "phone_intl": r"\+[1-9][0-9]{0,2} [0-9]{2,4}( [0-9]{2,4}){1,3}",
    "time_hm": r"([01][0-9]|2[0-3]):[0-5][0-9]( ?(AM|PM))?",
    "yes_no": r"(yes|no|maybe)",
    "prefix_alternation": r"(a|ab|abc)(x|xy)?",
    "repeat_group": r"(ab)+c?",
    "hex_color": r"#[0-9a-fA-F]{6}",
    "unicode_words": r"(café|naïve|日本語)( (café|naïve|日本語)){0,2}",
}


def check_formats(schema: Any, value: Any) -> None:
    """jsonschema skips formats whose checker packages are missing; check them with the stdlib."""
    import datetime
    import re
    import urllib.parse
    import uuid

    fmt = schema.get("format") if isinstance(schema, dict) else None
    if fmt == "date":
        datetime.date.fromisoformat(value)
    elif fmt == "date-time":
        assert value[-1] == "Z" or value[-6] in "+-", value  # RFC 3339 needs an offset
        # RFC 3339's time-second is 00-60 (a leap second); Python's datetime stops at 59.
        datetime.datetime.fromisoformat(re.sub(r"(T\d\d:\d\d:)60", r"\g<1>59", value))
    elif fmt == "time":
        assert value[-1] == "Z" or value[-6] in "+-", value
        datetime.time.fromisoformat(re.sub(r"^(\d\d:\d\d:)60", r"\g<1>59", value))
    elif fmt == "uuid":
        uuid.UUID(value)
    elif fmt == "uri":
        parts = urllib.parse.urlsplit(value)
        assert parts.scheme and parts.netloc and not re.search(r'[\s"\\<>]', value), value
    elif fmt == "email":
        assert re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-zA-Z]{2,}", value), value


def check_output(kind: str, name: str, text: str) -> None:
    """Raise (AssertionError / ValueError) unless `text` satisfies corpus spec `name` of `kind`."""
    import json
    import re

    import jsonschema

    if kind == "regex":
        assert re.fullmatch(REGEXES[name], text), (name, text)
        return
    schema = SCHEMAS[name]
    value = json.loads(text)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = [e.message for e in validator.iter_errors(value)]
    assert not errors, (name, text, errors)
    check_formats(schema, value)
