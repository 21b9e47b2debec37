"""Which subschemas apply where in a JSON document, resolved lazily while the document is generated.

Runs in the scheduler process (unique_items.py asks it, one container at a time). A position's scope is a
list of alternatives (`anyOf` / `oneOf` branches, multiplied out), each a tuple of schemas that all apply
there (`allOf`, `$ref` and its siblings). The walk only ever forgets constraints (if/then/else, `not`,
`contains`, dependent schemas, patterns Python's `re` cannot read are dropped), so a keyword required by
every alternative is really required; where that cannot be known (too many alternatives, `$dynamicRef`, an
unresolvable `$ref`), the scope is None and nothing below it is enforced.
"""

from __future__ import annotations

import re
from typing import Any

MAX_ALTERNATIVES = 32
MAX_REF_DEPTH = 24

Alt = tuple[tuple[dict, Any], ...]  # (schema, its referencing resolver) pairs that all apply
Scope = list[Alt] | None


class _Unknown(Exception):
    """This position's scope cannot be bounded: enforce nothing here."""


class SchemaScope:
    def __init__(self, schema: Any):
        from referencing import Registry
        from referencing.jsonschema import DRAFT202012, specification_with

        dialect = schema.get("$schema") if isinstance(schema, dict) else None
        spec = specification_with(dialect, default=DRAFT202012) if isinstance(dialect, str) else DRAFT202012
        resource = spec.create_resource(schema)
        uri = resource.id() or "urn:radixlm:schema"
        self._spec = spec
        self._resolver = Registry().with_resource(uri, resource).resolver(base_uri=uri)
        self._schema = schema
        # Keyed by object ids: each value keeps its resolver alive, so an id is never reused while cached.
        self._expanded: dict[tuple[int, int], tuple[Any, list[Alt]]] = {}
        self._patterns: dict[str, re.Pattern | None] = {}

    def root(self) -> Scope:
        return self._guard(lambda: self._expand(self._schema, self._resolver, 0))

    def member(self, scope: Scope, key: str) -> Scope:
        """The scope of the value under `key` in an object whose scope is `scope`."""
        if scope is None:
            return None
        return self._guard(lambda: self._children(scope, lambda s: self._member_schemas(s, key)))

    def item(self, scope: Scope, index: int) -> Scope:
        """The scope of item `index` in an array whose scope is `scope`."""
        if scope is None:
            return None
        return self._guard(lambda: self._children(scope, lambda s: _item_schemas(s, index)))

    @staticmethod
    def requires(scope: Scope, json_type: str, keyword: str) -> bool:
        """True when every alternative that admits a `json_type` value sets `keyword: true`."""
        if not scope:
            return False
        admitted = [alt for alt in scope if all(_admits(s, json_type) for s, _ in alt)]
        return bool(admitted) and all(any(s.get(keyword) is True for s, _ in alt) for alt in admitted)

    # ---- internals ----------------------------------------------------------------------------------
    @staticmethod
    def _guard(fn) -> Scope:
        try:
            return fn()
        except (_Unknown, RecursionError):
            return None

    def _children(self, scope: list[Alt], subschemas) -> list[Alt]:
        out: list[Alt] = []
        for alt in scope:
            combos: list[Alt] = [()]
            for schema, resolver in alt:
                for sub in subschemas(schema):
                    combos = _cross(combos, self._expand(sub, resolver, 0))
            out.extend(combos)
            if len(out) > MAX_ALTERNATIVES:
                raise _Unknown()
        return out

    def _expand(self, schema: Any, resolver: Any, depth: int) -> list[Alt]:
        if schema is True or schema == {}:
            return [()]
        if schema is False:
            return []
        if not isinstance(schema, dict) or depth > MAX_REF_DEPTH:
            raise _Unknown()
        key = (id(schema), id(resolver))
        if key not in self._expanded:
            self._expanded[key] = (resolver, self._expand_dict(schema, resolver, depth))
        return self._expanded[key][1]

    def _expand_dict(self, schema: dict, resolver: Any, depth: int) -> list[Alt]:
        if "$dynamicRef" in schema or "$recursiveRef" in schema:
            raise _Unknown()
        if "$id" in schema or "id" in schema:
            resolver = self._enter(schema, resolver)
        alts: list[Alt] = [((schema, resolver),)]
        ref = schema.get("$ref")
        if isinstance(ref, str):
            try:
                found = resolver.lookup(ref)
            except Exception:  # noqa: BLE001 - referencing raises several Unresolvable kinds
                raise _Unknown() from None
            alts = _cross(alts, self._expand(found.contents, found.resolver, depth + 1))
        for sub in _list(schema.get("allOf")):
            alts = _cross(alts, self._expand(sub, resolver, depth + 1))
        for word in ("anyOf", "oneOf"):
            branches = _list(schema.get(word))
            if branches:
                union = [a for sub in branches for a in self._expand(sub, resolver, depth + 1)]
                alts = _cross(alts, union)
        if len(alts) > MAX_ALTERNATIVES:
            raise _Unknown()
        return alts

    def _enter(self, schema: dict, resolver: Any) -> Any:
        try:
            return resolver.in_subresource(self._spec.create_resource(schema))
        except Exception:  # noqa: BLE001 - a malformed $id: relative refs below cannot be trusted
            raise _Unknown() from None

    def _member_schemas(self, schema: dict, key: str) -> list[Any]:
        found = []
        props = schema.get("properties")
        if isinstance(props, dict) and key in props:
            found.append(props[key])
        patterns = schema.get("patternProperties")
        if isinstance(patterns, dict):
            found += [sub for pat, sub in patterns.items() if self._matches(pat, key)]
        if not found and "additionalProperties" in schema:
            found.append(schema["additionalProperties"])
        return found

    def _matches(self, pattern: str, key: str) -> bool:
        if pattern not in self._patterns:
            try:
                self._patterns[pattern] = re.compile(pattern)
            except (re.error, TypeError):
                self._patterns[pattern] = None  # not applied: only a forgotten constraint
        rx = self._patterns[pattern]
        return rx is not None and rx.search(key) is not None


def _item_schemas(schema: dict, index: int) -> list[Any]:
    prefix, items = schema.get("prefixItems"), schema.get("items")
    if isinstance(prefix, list):
        return [prefix[index]] if index < len(prefix) else ([items] if items is not None else [])
    if isinstance(items, list):  # draft 4-7 tuple form
        if index < len(items):
            return [items[index]]
        extra = schema.get("additionalItems")
        return [extra] if extra is not None else []
    return [items] if items is not None else []


def _admits(schema: dict, json_type: str) -> bool:
    t = schema.get("type")
    if t is None:
        return True
    types = t if isinstance(t, list) else [t]
    return json_type in types


def _cross(left: list[Alt], right: list[Alt]) -> list[Alt]:
    out = [a + b for a in left for b in right]
    if len(out) > MAX_ALTERNATIVES:
        raise _Unknown()
    return out


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []
