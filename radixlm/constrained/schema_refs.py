"""Local `$ref` resolution for schema lowering: JSON pointers, `$id`, `$anchor`, `$dynamicAnchor`.

Runs in compile workers. Only the document itself is ever read (nothing is fetched): a `$ref` is local
when it starts with `#`, or when its URL part is the document's own `$id` (or an `$id` inside it).
Everything else is refused as external.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from radixlm.constrained.errors import INVALID_GRAMMAR, GrammarError

_CHILD_MAPS = ("$defs", "definitions", "properties", "patternProperties", "dependentSchemas", "dependencies")
_CHILD_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_CHILD_ONE = ("not", "if", "then", "else", "items", "additionalItems", "additionalProperties", "contains",
              "propertyNames", "unevaluatedItems", "unevaluatedProperties")


def _err(message: str) -> GrammarError:
    return GrammarError("json_schema", INVALID_GRAMMAR, message)


def _children(node: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for key in _CHILD_MAPS:
        if isinstance(node.get(key), dict):
            out.extend(node[key].values())
    for key in _CHILD_LISTS:
        if isinstance(node.get(key), list):
            out.extend(node[key])
    for key in _CHILD_ONE:
        if isinstance(node.get(key), dict):
            out.append(node[key])
    return out


class RefIndex:
    """Every resource (`$id`) and anchor of one document, and the base URI of each subschema."""

    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.resources: dict[str, Any] = {}  # absolute URI without fragment -> subschema
        self.anchors: dict[str, Any] = {}    # absolute URI#anchor -> subschema
        self.bases: dict[int, str] = {}      # id(subschema) -> its base URI
        self.dynamic: dict[str, int] = {}    # $dynamicAnchor name (or "" for $recursiveAnchor) -> how many
        self._walk(root, "")

    def _walk(self, root: dict[str, Any], base: str) -> None:
        legacy = _ref_ignores_siblings(root)
        stack: list[tuple[Any, str]] = [(root, base)]
        while stack:
            node, base = stack.pop()
            if not isinstance(node, dict):
                continue
            ident = node.get("$id", node.get("id")) if not (legacy and "$ref" in node) else None
            if isinstance(ident, str) and not ident.startswith("#"):
                base = urldefrag(urljoin(base, ident))[0]
                self.resources.setdefault(base, node)
            elif isinstance(ident, str) and ident.startswith("#") and len(ident) > 1:  # draft-4/6 anchor
                self.anchors.setdefault(base + ident, node)
            for key in ("$anchor", "$dynamicAnchor"):
                if isinstance(node.get(key), str):
                    self.anchors.setdefault(f"{base}#{node[key]}", node)
            name = node["$dynamicAnchor"] if isinstance(node.get("$dynamicAnchor"), str) else \
                "" if node.get("$recursiveAnchor") is True else None
            if name is not None:
                self.dynamic[name] = self.dynamic.get(name, 0) + 1
            self.bases[id(node)] = base
            stack.extend((child, base) for child in _children(node))
        self.resources.setdefault("", root)

    def resolves_dynamically(self, node: dict[str, Any]) -> bool:
        """Whether the node's $dynamicRef / $recursiveRef may resolve to another schema than its static
        target: its anchor name is declared more than once, so the dynamic scope could pick another."""
        ref = node.get("$dynamicRef")
        if isinstance(ref, str):
            return self.dynamic.get(urldefrag(ref)[1], 0) > 1
        return isinstance(node.get("$recursiveRef"), str) and self.dynamic.get("", 0) > 1

    def base_of(self, node: Any, fallback: str) -> str:
        return self.bases.get(id(node), fallback)

    def resolve(self, ref: Any, base: str, path: str) -> tuple[str, Any]:
        """(canonical key, target subschema) for a $ref seen under `base`, or GrammarError."""
        if not isinstance(ref, str):
            raise _err(f"$ref at {path} must be a string")
        url, fragment = urldefrag(urljoin(base, ref)) if base or not ref.startswith("#") else ("", ref[1:])
        if url not in self.resources:
            raise _err(f"external $ref '{_short(ref)}' at {path} is not supported (only refs inside the "
                       "document; nothing is fetched)")
        doc = self.resources[url]
        if fragment and not fragment.startswith("/"):
            target = self.anchors.get(f"{url}#{fragment}")
            if target is None:
                raise _err(f"$ref '{_short(ref)}' at {path} does not resolve")
            return f"{url}#{fragment}", target
        target = _pointer(doc, fragment)
        if target is None and doc is not self.root:
            # Bundled schemas often keep each definition's `id` but point from inside it at the root's
            # definitions: resolve against the document as a whole before giving up.
            url, target = self._root_url(), _pointer(self.root, fragment)
        if target is None:
            raise _err(f"$ref '{_short(ref)}' at {path} does not resolve")
        return f"{url}#{fragment}", target

    def _root_url(self) -> str:
        return next((u for u, node in self.resources.items() if node is self.root), "")


def _ref_ignores_siblings(root: dict[str, Any]) -> bool:
    """Drafts 4-7 ignore every sibling of a `$ref`, an `$id` included (its base URI stays the parent's).
    A schema without `$schema` is read as draft 7, as the output validator reads it (validate.py)."""
    dialect = root.get("$schema")
    return not isinstance(dialect, str) or any(d in dialect for d in ("draft-03", "draft-04", "draft-06", "draft-07"))


def _pointer(doc: Any, fragment: str) -> Any:
    """The node at a JSON pointer (percent-decoded, `~1` / `~0` unescaped), or None."""
    target = doc
    for part in fragment.split("/")[1:]:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        elif isinstance(target, dict) and part in target:
            target = target[part]
        else:
            return None
    return target


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def rebase_bundled_refs(schema: Any, root_key: str) -> Any:
    """The schema for a validator (jsonschema), with RefIndex.resolve's fallback for bundled schemas made
    explicit: a `#/...` ref inside a subschema with its own `id` that points nowhere in that resource but
    somewhere in the root is rewritten to point at the root (which gets an `id` under `root_key`, `id` for
    draft 4, `$id` otherwise, when it has none). So the validator reads such refs as the grammar did,
    instead of failing on them. Returns the schema itself when nothing needs rewriting."""
    if not isinstance(schema, dict):
        return schema
    index = RefIndex(schema)
    own_root = index._root_url()
    root_uri = own_root or "urn:radixlm:root"
    fixes: list[tuple[dict, str]] = []
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        stack.extend(_children(node))
        base, ref = index.bases.get(id(node), ""), node.get("$ref")
        if not base or base == own_root or not (isinstance(ref, str) and ref.startswith("#/")):
            continue
        doc = index.resources.get(base)
        if doc is not None and _pointer(doc, ref[1:]) is None and _pointer(schema, ref[1:]) is not None:
            fixes.append((node, f"{root_uri}{ref}"))
    if not fixes:
        return schema
    memo: dict[int, Any] = {}
    out = copy.deepcopy(schema, memo)
    for node, ref in fixes:
        memo[id(node)]["$ref"] = ref
    if not own_root:
        out[root_key] = root_uri
    return out

