"""Finished JSON-schema outputs are checked with jsonschema (constrained/validate.py): what a grammar only
approximates, or an output cut short, is reported, never passed off as valid."""

from __future__ import annotations

import json

from radixlm.constrained.validate import check_json_output

ONE_OF = json.dumps({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]})
UNIQUE = json.dumps({"type": "array", "items": {}, "uniqueItems": True})


def test_valid_output_passes():
    check = check_json_output(json.dumps({"type": "object", "required": ["a"]}), '{"a": 1}', complete=True)
    assert check.valid and check.error is None
    assert check.to_meta() == {"json_schema_valid": True}


def test_one_of_exclusivity_is_checked():
    assert check_json_output(ONE_OF, "-3", complete=True).valid  # only the integer branch
    check = check_json_output(ONE_OF, "3", complete=True)  # both branches: oneOf fails
    assert not check.valid and "valid under each of" in check.error and "(root)" in check.error


def test_unique_items_and_the_path_of_the_violation():
    assert check_json_output(UNIQUE, '[1, "1", [1]]', complete=True).valid
    nested = json.dumps({"type": "object", "properties": {"tags": json.loads(UNIQUE)}})
    check = check_json_output(nested, '{"tags": [{"a": 1}, {"a": 1}]}', complete=True)
    assert not check.valid and "non-unique" in check.error and "(at tags)" in check.error


def test_lookaround_pattern_is_checked_on_the_text():
    schema = json.dumps({"type": "string", "pattern": "^(?!admin)[a-z]+$"})
    assert check_json_output(schema, '"alice"', complete=True).valid
    assert not check_json_output(schema, '"administrator"', complete=True).valid


def test_cut_and_non_json_outputs_are_not_valid():
    cut = check_json_output(ONE_OF, "12", complete=False)
    assert not cut.valid and cut.error.startswith("incomplete")
    bad = check_json_output(ONE_OF, '{"a": ', complete=True)
    assert not bad.valid and bad.error.startswith("not JSON")
    assert cut.to_meta() == {"json_schema_valid": False, "json_schema_error": cut.error}


def test_formats_are_asserted():
    schema = json.dumps({"type": "string", "format": "ipv4"})
    assert check_json_output(schema, '"10.0.0.1"', complete=True).valid
    assert not check_json_output(schema, '"10.0.0.999"', complete=True).valid


def test_draft_from_dollar_schema_and_no_remote_fetch():
    draft4 = json.dumps({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number",
                         "maximum": 5, "exclusiveMaximum": True})
    assert check_json_output(draft4, "4", complete=True).valid
    assert not check_json_output(draft4, "5", complete=True).valid
    remote = json.dumps({"$ref": "https://example.invalid/schema.json"})  # never fetched
    check = check_json_output(remote, "1", complete=True)
    assert not check.valid and check.error.startswith("validation failed")


def test_patterns_are_ecma_262():
    """\\p{Lu} is a Unicode property in ECMA-262 (JSON Schema's dialect), an error in Python's re."""
    schema = json.dumps({"type": "string", "pattern": "^\\p{Lu}[a-z]+$"})
    assert check_json_output(schema, '"Émile"', complete=True).valid
    assert not check_json_output(schema, '"émile"', complete=True).valid


def test_draft_without_dollar_schema_is_the_one_its_keywords_fit():
    tuple_items = json.dumps({"type": "array", "items": [{"type": "integer"}, {"type": "string"}]})
    assert check_json_output(tuple_items, '[1, "a"]', complete=True).valid
    assert not check_json_output(tuple_items, '["a", 1]', complete=True).valid
    draft4 = json.dumps({"type": "integer", "maximum": 5, "exclusiveMaximum": True})
    assert not check_json_output(draft4, "5", complete=True).valid


def test_bundled_schema_refs_read_against_the_root_as_the_grammar_does():
    """A bundled draft-4 schema (AsyncAPI 1.x style): a definition keeps its own `id` and points from
    inside it at the root's definitions. Strictly that ref resolves inside the definition's own resource
    (where it points nowhere); the grammar reads it against the root (schema_refs.RefIndex), and so does
    the validator, instead of failing to validate at all."""
    from radixlm.constrained.schema_refs import rebase_bundled_refs

    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"topics": {"$ref": "#/definitions/topics"}},
              "definitions": {
                  "topics": {"id": "http://example.com/topics.json", "type": "object",
                             "additionalProperties": {"$ref": "#/definitions/topic"}},
                  "topic": {"type": "object", "minProperties": 1}}}
    spec = json.dumps(schema)
    assert check_json_output(spec, '{"topics": {"a": {"x": 1}}}', True).to_meta() == {"json_schema_valid": True}
    bad = check_json_output(spec, '{"topics": {"a": {}}}', True)
    assert bad.valid is False and "non-empty" in bad.error and "topics/a" in bad.error
    plain = {"type": "object", "properties": {"a": {"$ref": "#/definitions/x"}}, "definitions": {"x": {}}}
    assert rebase_bundled_refs(plain, "$id") is plain  # nothing to rewrite: the schema itself
