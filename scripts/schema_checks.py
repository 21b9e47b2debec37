"""What collect_schemas.py checks on each candidate file: is it a JSON schema, which draft, is it
self-contained (every $ref resolves inside the file), does its own meta-schema accept it."""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any
from urllib.parse import unquote, urljoin, urldefrag

MAX_FILE_BYTES = 1024 * 1024  # keeps the corpus small; larger files are counted as left out
SCHEMA_KEYS = {"type", "properties", "definitions", "$defs", "oneOf", "anyOf", "allOf", "$ref", "items", "enum"}
DRAFTS = (("draft-03", "draft3"), ("draft-04", "draft4"), ("draft-06", "draft6"), ("draft-07", "draft7"),
          ("2019-09", "draft2019-09"), ("2020-12", "draft2020-12"))


def canonical_hash(schema: Any) -> str:
    return hashlib.sha256(json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def draft_of(schema: dict) -> str:
    """"draft4" ... "draft2020-12" from $schema, else "unspecified" (validated as draft 7)."""
    uri = schema.get("$schema")
    if isinstance(uri, str):
        for needle, name in DRAFTS:
            if needle in uri:
                return name
    return "unspecified"


def looks_like_schema(doc: Any) -> bool:
    if not isinstance(doc, dict):
        return False
    uri = doc.get("$schema")
    return (isinstance(uri, str) and "schema" in uri) or bool(SCHEMA_KEYS & doc.keys())


def _walk(node: Any, base: str, refs: list[tuple[str, str]], ids: set[str]) -> None:
    if isinstance(node, dict):
        for key in ("$id", "id"):
            value = node.get(key)
            if isinstance(value, str) and not value.startswith("#"):
                base = urljoin(base, value)
                ids.add(urldefrag(base)[0])
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef", "$recursiveRef") and isinstance(value, str):
                refs.append((base, value))
            elif key not in ("enum", "const", "default", "examples", "example"):
                _walk(value, base, refs, ids)
    elif isinstance(node, list):
        for item in node:
            _walk(item, base, refs, ids)


def _resolve_pointer(doc: Any, pointer: str) -> bool:
    node = doc
    for part in pointer.split("/")[1:]:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def ref_problem(schema: dict) -> str | None:
    """"external $ref" if a $ref points outside the file, "dangling local $ref" if a local one does not
    resolve, else None. A $ref to the file's own (or a nested) $id counts as local."""
    root = "https://radixlm.invalid/root.json"  # a stand-in base URI (urljoin ignores urn: bases)
    for key in ("$id", "id"):
        if isinstance(schema.get(key), str) and not schema[key].startswith("#"):
            root = urljoin(root, schema[key])
            break
    root = urldefrag(root)[0]
    refs: list[tuple[str, str]] = []
    ids = {root}
    _walk(schema, root, refs, ids)
    for base, ref in refs:
        target, fragment = urldefrag(urljoin(base, ref))
        if target not in ids:
            return "external $ref"
        if fragment.startswith("/") and target == root and not _resolve_pointer(schema, fragment):
            return "dangling local $ref"
    return None


def meta_schema_problem(schema: dict) -> str | None:
    """Checked without formats: the `regex` format is Python's re, which refuses ECMA-262 patterns such as
    `\\p{L}` that real schemas (written for JavaScript validators) use."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        error = jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema))
    return "fails its meta-schema" if error is not None else None


def exclusion_reason(schema: Any, size: int = 0) -> str | None:
    """None if the schema goes into the corpus, else why not ("not a schema" is not counted)."""
    if not looks_like_schema(schema):
        return "not a schema"
    if size > MAX_FILE_BYTES:
        return "over 1 MiB"
    if draft_of(schema) == "draft3":
        return "draft 3"
    return ref_problem(schema) or meta_schema_problem(schema)

