"""JSON Schema lowering: a real-world schema (drafts 4 to 2020-12) -> a self-contained schema in the
subset one grammar library compiles, plus the list of constraints the grammar does not enforce exactly.

Runs in compile workers (and in any process for tests/tools). Two passes:
  * `_Lowerer` (here) turns every node into a lowered node (see schema_merge.py): annotations and
    unknown keywords dropped, draft-4 forms rewritten, `$ref` resolved (schema_refs.py), `allOf` /
    `$ref` siblings merged, `anyOf` / `oneOf` / `if` / `not` / dependencies written as `anyOf`;
  * schema_emit.py splits nodes by type and keeps, per target, only what the library enforces.
Whatever is dropped makes the grammar looser, never stricter (except recursion unrolled for outlines),
and is named in `approximations`; the finished output is validated against the original schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import reduce
from typing import Any

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError
from radixlm.constrained.schema_merge import NEVER, TYPES, Conflict, Merger, any_of, canon, is_never
from radixlm.constrained.schema_disjoint import Memo, disjoint
from radixlm.constrained.schema_negate import negate
from radixlm.constrained.schema_refs import RefIndex

TARGETS = ("outlines", "xgrammar", "llguidance")
MAX_NODES = 20_000      # inlining a DAG of $refs can grow a schema exponentially
# A root keyword (our own: validators ignore `x-` keywords) asking for listed_only, as OpenAI's strict mode does
# (server/openai_format.py adds it to a strict response_format); a native json_schema may send it too.
LISTED_ONLY_KEYWORD = "x-radixlm-listed-only"
UNROLL_DEPTH = 3        # outlines (a regex) cannot recurse: a recursive $ref is expanded this deep
MAX_DEPENDENCIES = 6    # each dependency doubles the branches
MAX_EXCLUSIVE = (4, 16)  # a oneOf written exactly: at most this many branches, before and after
_FLAT = ("enum", "required", "minProperties", "maxProperties", "minItems", "maxItems", "uniqueItems",
         "minContains", "maxContains", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
         "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_NUMERIC = frozenset(_FLAT) - {"enum", "required", "uniqueItems", "pattern", "format"}


@dataclass(frozen=True)
class LoweredSchema:
    """`schema` is self-contained (no external refs) and uses only what `target` compiles exactly;
    `approximations` lists "keyword at path" for each constraint the grammar does not enforce exactly
    (the finished output must still be validated against the original schema)."""

    schema: dict[str, Any]
    approximations: tuple[str, ...]


def _err(message: str, code: str = INVALID_GRAMMAR) -> GrammarError:
    return GrammarError("json_schema", code, message)


def _legacy(node: dict[str, Any]) -> dict[str, Any]:
    """Draft 4-7 spellings -> 2020-12 ones (boolean exclusive bounds, tuple items, dependencies)."""
    n = dict(node)
    for excl, incl in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(n.get(excl), bool):
            if n.pop(excl) and incl in n:
                n[excl] = n.pop(incl)
    if isinstance(n.get("items"), list):
        n["prefixItems"] = n.pop("items")
        if "additionalItems" in n:
            n["items"] = n.pop("additionalItems")
    n.pop("additionalItems", None)
    if isinstance(n.get("dependencies"), dict):
        for key, dep in n.pop("dependencies").items():
            target = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
            n.setdefault(target, {})[key] = dep
    if "divisibleBy" in n:
        n.setdefault("multipleOf", n.pop("divisibleBy"))
    if "const" in n:
        const = n.pop("const")
        n["enum"] = [const] if not isinstance(n.get("enum"), list) else \
            [v for v in n["enum"] if canon(v) == canon(const)]
    for key in ("$dynamicRef", "$recursiveRef"):
        if key in n and "$ref" not in n:
            n["$ref"] = n.pop(key)
    return n


class _Lowerer:
    def __init__(self, root: dict[str, Any], target: str, unroll: int = UNROLL_DEPTH):
        self.unroll = unroll
        self.index = RefIndex(root)
        self.target = target
        self.notes: list[str] = []
        self.nodes = 0
        self.stack: list[str] = []          # refs being expanded (outlines)
        self.cache: dict[str, dict[str, Any]] = {}
        self.cutoffs = 0
        self.defs: dict[str, dict[str, Any]] = {}   # xgrammar / llguidance: one def per ref target
        self.def_names: dict[str, str] = {}
        self.conflict = ""
        self.one_ofs: list[tuple[list[dict[str, Any]], str]] = []
        self.expanding: set[str] = set()    # defs being lowered (their entry is a placeholder)
        self.finished = Memo(self._finished_def)  # a pair met while one was unfinished stays "may overlap"
        self.merger = Merger(self._deref, self.notes.append)

    def lower(self, node: Any, path: str, base: str) -> dict[str, Any]:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _err(f"schema expands to more than {MAX_NODES} nodes", GRAMMAR_TOO_LARGE)
        if node is True:
            return {}
        if node is False:
            return dict(NEVER)
        if not isinstance(node, dict):
            self.notes.append(f"non-schema value at {path}")
            return {}
        base = self.index.base_of(node, base)
        if "$ref" not in node and self.index.resolves_dynamically(node):  # lowered as a static $ref below
            self.notes.append(f"$dynamicRef at {path} resolved statically")
        n = _legacy(node)
        parts = [self._flat(n, path, base)]
        if "$ref" in n:
            parts.append(self._ref(n["$ref"], path, base))
        parts.extend(self.lower(s, f"{path}/allOf/{i}", base) for i, s in enumerate(_list(n, "allOf")))
        for key in ("anyOf", "oneOf"):
            if key in n:
                branches = [self.lower(s, f"{path}/{key}/{i}", base) for i, s in enumerate(_list(n, key))]
                if key == "oneOf" and not disjoint(branches, self.finished):
                    exclusive = self._exclusive(branches, path)
                    if exclusive is not None:
                        parts.append(exclusive)
                        continue
                    self.one_ofs.append((branches, path))  # checked again once every def is known
                parts.append(any_of(branches))
        if "not" in n:
            neg = negate(self.lower(n["not"], f"{path}/not", base))
            if neg is None:
                self.notes.append(f"not at {path}")
            else:
                parts.append(neg)
        parts.extend(self._conditional(n, path, base))
        parts.extend(self._dependencies(n, path, base))
        if "unevaluatedProperties" in n or "unevaluatedItems" in n:
            self.notes.append(f"unevaluated* at {path}")
        return self._merge_all(parts, path)

    def _merge_all(self, parts: list[dict[str, Any]], path: str) -> dict[str, Any]:
        try:
            return reduce(lambda a, b: self.merger.merge(a, b, path), parts, {})
        except Conflict as e:
            self.conflict = str(e)
            return dict(NEVER)

    def _flat(self, n: dict[str, Any], path: str, base: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        kind = n.get("type")
        if isinstance(kind, str) and kind in TYPES:
            out["type"] = [kind]
        elif isinstance(kind, list) and kind and all(t in TYPES for t in kind):
            out["type"] = list(dict.fromkeys(kind))
        for key in _FLAT:
            if key not in n:
                continue
            value = n[key]
            if key in _NUMERIC and (isinstance(value, bool) or not isinstance(value, (int, float))):
                self.notes.append(f"malformed {key} at {path}")
            elif key == "required" and not isinstance(value, list) or key == "enum" and not isinstance(value, list):
                self.notes.append(f"malformed {key} at {path}")
            else:
                out[key] = value
        for key in ("properties", "patternProperties"):
            if isinstance(n.get(key), dict):
                out[key] = {k: self.lower(v, f"{path}/{key}/{k}", base) for k, v in n[key].items()}
        for key in ("additionalProperties", "propertyNames", "items", "contains"):
            if key in n:
                out[key] = self.lower(n[key], f"{path}/{key}", base)
        if "prefixItems" in n:
            out["prefixItems"] = [self.lower(s, f"{path}/prefixItems/{i}", base)
                                  for i, s in enumerate(_list(n, "prefixItems"))]
        return out

    def _conditional(self, n: dict[str, Any], path: str, base: str) -> list[dict[str, Any]]:
        if "if" not in n or ("then" not in n and "else" not in n):
            return []
        cond = self.lower(n["if"], f"{path}/if", base)
        then = self.lower(n.get("then", True), f"{path}/then", base)
        other = self.lower(n.get("else", True), f"{path}/else", base)
        neg = negate(cond)
        if neg is None:  # either branch holds for every valid value: their union is looser
            self.notes.append(f"if at {path}")
            return [any_of([then, other])]
        return [any_of([self._merge_all([cond, then], path), self._merge_all([neg, other], path)])]

    def _dependencies(self, n: dict[str, Any], path: str, base: str) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        deps = [(k, {"required": [k, *v]}) for k, v in n.get("dependentRequired", {}).items() if isinstance(v, list)]
        deps += [(k, self._merge_all([{"required": [k]}, self.lower(s, f"{path}/dependentSchemas/{k}", base)], path))
                 for k, s in n.get("dependentSchemas", {}).items()]
        for i, (key, present) in enumerate(deps):
            if i >= MAX_DEPENDENCIES:
                self.notes.append(f"dependencies at {path} (past the first {MAX_DEPENDENCIES})")
                break
            parts.append(any_of([present, {"properties": {key: dict(NEVER)}}]))
        return parts

    def _ref(self, ref: Any, path: str, base: str) -> dict[str, Any]:
        key, target = self.index.resolve(ref, base, path)
        target_base = self.index.base_of(target, base)
        if self.target != "outlines":
            return self._def_ref(key, target, target_base)
        if key in self.cache:
            return self.cache[key]
        if self.stack.count(key) >= self.unroll:
            self.cutoffs += 1
            self.notes.append(f"recursive $ref '{ref}' unrolled to depth {self.unroll} (below it any value "
                              "is allowed; the xgrammar and llguidance backends recurse)")
            return {}
        before = self.cutoffs
        self.stack.append(key)
        try:
            lowered = self.lower(target, f"{path}->{key}", target_base)
        finally:
            self.stack.pop()
        if self.cutoffs == before:
            self.cache[key] = lowered
        return lowered

    def _def_ref(self, key: str, target: Any, base: str) -> dict[str, Any]:
        if key not in self.def_names:
            name = "d" + str(len(self.def_names))
            self.def_names[key] = name
            self.defs[name] = {}  # in progress: a merge that needs it meanwhile sees `{}` (noted)
            self.expanding.add(name)
            try:
                self.defs[name] = self.lower(target, key, base)
            finally:
                self.expanding.discard(name)
        return {"$ref": f"#/$defs/{self.def_names[key]}"}

    def _finished_def(self, ref: str) -> dict[str, Any] | None:
        name = ref.rsplit("/", 1)[-1]
        return None if name in self.expanding else self.defs.get(name)

    def _exclusive(self, branches: list[dict[str, Any]], path: str) -> dict[str, Any] | None:
        """oneOf written exactly as anyOf_i (branch_i and not branch_j, j != i), when every branch has a
        simple complement (types, consts, required or const properties: negate()); else None."""
        if len(branches) > MAX_EXCLUSIVE[0] or self.target == "outlines":  # its regex grows with each copy
            return None
        negations = []
        for branch in branches:
            target = self._finished_def(branch["$ref"]) if "$ref" in branch else branch
            neg = None if target is None else negate(target)
            if neg is None or "notEnum" in json.dumps(neg):  # no target enforces "not one of these"
                return None
            negations.append(neg)
        notes: list[str] = []
        merger = Merger(self._deref, notes.append)
        out = []
        for i, branch in enumerate(branches):
            try:
                out.append(reduce(lambda a, b: merger.merge(a, b, path),
                                  [n for j, n in enumerate(negations) if j != i], branch))
            except Conflict:
                continue
        if notes:  # a merge that had to approximate (a recursive def inlined into itself)
            return None
        result = any_of(out)
        return result if len(result.get("anyOf", [result])) <= MAX_EXCLUSIVE[1] else None

    def check_one_ofs(self) -> None:
        """Each oneOf whose branches a value may match twice is enforced as anyOf: say so."""
        known = Memo(lambda ref: self.defs.get(ref.rsplit("/", 1)[-1]))
        for branches, path in self.one_ofs:
            if not disjoint(branches, known):
                self.notes.append(f"oneOf at {path} (enforced as anyOf)")

    def _deref(self, ref: str) -> dict[str, Any]:
        name = ref.rsplit("/", 1)[-1]
        found = self.defs.get(name)
        if not found:
            self.notes.append(f"$ref '{ref}' merged while it was being expanded")
        return found or {}


def _list(n: dict[str, Any], key: str) -> list[Any]:
    value = n.get(key)
    return value if isinstance(value, list) else []


def lower_schema(spec: str, options: GrammarOptions, target: str, listed_only: bool = False) -> LoweredSchema:
    """Lower a json_schema spec for `target` ("outlines" | "xgrammar" | "llguidance"), or GrammarError.
    listed_only (tool arguments): objects that list `properties` and say nothing else about other keys
    get only the listed ones, as xgrammar's and outlines' objects always do (docs/json_schema.md); a schema
    whose root says `"x-radixlm-listed-only": true` asks for the same."""
    from radixlm.constrained.json_schema import load_schema
    from radixlm.constrained.schema_emit import emit

    if target not in TARGETS:
        raise ValueError(f"unknown lowering target {target!r}; known: {TARGETS}")
    root = load_schema(spec, options)
    listed_only = root.pop(LISTED_ONLY_KEYWORD, False) is True or listed_only
    for unroll in (UNROLL_DEPTH, 1) if target == "outlines" else (UNROLL_DEPTH,):
        lowerer = _Lowerer(root, target, unroll)
        try:
            lowered = lowerer.lower(root, "#", "")
            break
        except GrammarError as e:  # a widely recursive schema: expand each $ref once only
            if e.code != GRAMMAR_TOO_LARGE or unroll == 1 or not lowerer.cutoffs:
                raise
        except (TypeError, AttributeError, KeyError, ValueError, RecursionError) as e:
            # The meta-schema check is lenient (any draft), so a keyword of a later draft may have
            # a shape the lowering does not expect: a 400 naming it, never a 500.
            raise _err(f"malformed schema ({type(e).__name__}: {str(e)[:120]})") from None
    lowerer.check_one_ofs()
    schema, notes, empty_enum = emit(lowered, lowerer.defs, target, listed_only)
    if is_never(schema):
        why = lowerer.conflict or (empty_enum and f"no value of the enum at {empty_enum} matches its other keywords")
        raise _err("schema admits no value" + (f" ({why})" if why else ""))
    approximations = tuple(dict.fromkeys(lowerer.notes + notes))
    return LoweredSchema(schema, approximations)
