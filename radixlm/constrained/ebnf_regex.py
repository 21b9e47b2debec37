"""`ebnf` grammars -> one regex, for the outlines backend (which compiles regular languages only).

Runs in compile workers. GBNF is first turned into Lark by llguidance's converter (ebnf.py); the Lark
text is parsed by the `lark` library with the meta-grammar below (Lark's rule syntax plus the `{m,n}`
repetition of llguidance's dialect, which the converter emits), then every rule is inlined into its
callers. A rule that reaches itself is not regular: it is refused by name (the llguidance and xgrammar
backends compile it). `%ignore` terminals are allowed between the symbols of rules (lower-case names),
not inside terminals, as in Lark. `%import common.X` takes X from Lark's own common.lark.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.ebnf import PARAM, ebnf_to_lark
from radixlm.constrained.errors import INVALID_GRAMMAR, GrammarError
from radixlm.constrained.specs import escape_literal

_META = r"""
start: (_item? _NL)* _item?
_item: rule | ignore | import_one | import_many | declare | llg
rule: RULE_HEAD expansions
expansions: alias (_OR alias)*
?alias: expansion ("->" NAME)?
expansion: expr*
?expr: atom | atom quant
quant: OP | "~" INT (".." INT)? | "{" INT "}" | "{" INT "," INT? "}"
?atom: "(" expansions ")"
     | "[" expansions "]" -> maybe
     | STRING ".." STRING -> range
     | STRING -> literal
     | REGEXP -> regexp
     | NAME -> ref
ignore: "%ignore" expansions
import_one: "%import" DOTTED ("->" NAME)?
import_many: "%import" DOTTED "(" NAME ("," NAME)* ")"
declare: "%declare" NAME+
llg: LLG
LLG: /%llguidance[^\n]*/
RULE_HEAD: /[?!]?[A-Za-z_][A-Za-z0-9_]*(\.-?[0-9]+)?[\t ]*:/
DOTTED: /[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+/
NAME: /[A-Za-z_][A-Za-z0-9_]*/
OP: /[+*]|[?](?![a-z])/
INT: /[0-9]+/
STRING: /"(\\.|[^"\\\n])*"i?/
REGEXP: /\/(?!\/)(\\\/|\\\\|[^\/\n])*?\/[imslux]*/
_OR: /(\r?\n[\t ]*)*\|/
_NL: /(\r?\n[\t ]*)+/
COMMENT: /\/\/[^\n]*/
%ignore /[\t \f]+/
%ignore COMMENT
"""

# Terminals of common.lark written with look-behind (which regex engines here refuse), as plain regexes
# for the same language.
_COMMON_OVERRIDES = {
    "_STRING_INNER": r"[^\n]*",
    "_STRING_ESC_INNER": r'(?:[^"\\\n]|\\[^\n])*',
    "ESCAPED_STRING": r'"(?:[^"\\\n]|\\[^\n])*"',
}


@functools.lru_cache(maxsize=1)
def _parser() -> Any:
    from lark import Lark

    return Lark(_META, parser="lalr", lexer="contextual", maybe_placeholders=False)


def _parse(text: str) -> Any:
    from lark.exceptions import LarkError

    try:
        return _parser().parse(text if text.endswith("\n") else text + "\n")
    except LarkError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "syntax error"
        raise GrammarError(PARAM, INVALID_GRAMMAR, f"cannot read the grammar: {first}"[:240]) from None


@functools.lru_cache(maxsize=1)
def _common_rules() -> dict[str, Any]:
    import importlib.resources

    text = importlib.resources.files("lark").joinpath("grammars/common.lark").read_text("utf-8")
    return _collect(_parse(text))[0]


def _collect(tree: Any) -> tuple[dict[str, Any], list[Any], list[tuple[str, str]]]:
    """(rule name -> expansions tree, %ignore expansions, (imported name, local name))."""
    rules: dict[str, Any] = {}
    ignores: list[Any] = []
    imports: list[tuple[str, str]] = []
    for item in tree.children:
        kind = item.data
        if kind == "rule":
            head = re.match(r"[?!]?([A-Za-z_][A-Za-z0-9_]*)", str(item.children[0])).group(1)
            if head in rules:
                raise GrammarError(PARAM, INVALID_GRAMMAR, f"rule '{head}' is defined twice")
            rules[head] = item.children[1]
        elif kind == "ignore":
            ignores.append(item.children[0])
        elif kind in ("import_one", "import_many"):
            path = str(item.children[0]).split(".")
            if kind == "import_one":
                imports.append((path[-1], str(item.children[1]) if len(item.children) > 1 else path[-1]))
                path = path[:-1]
            else:
                imports.extend((str(n), str(n)) for n in item.children[1:])
            if path != ["common"]:
                raise GrammarError(PARAM, INVALID_GRAMMAR, "only `%import common.NAME` is supported")
        elif kind == "declare":
            raise GrammarError(PARAM, INVALID_GRAMMAR, "%declare is not supported")
    return rules, ignores, imports


class _Emitter:
    """Inlines rules into one regex; `_stack` holds the rules being expanded (to name a recursion)."""

    def __init__(self, rules: dict[str, Any], ignore: str | None):
        self.rules = rules
        self.ignore = ignore
        self._done: dict[str, str] = {}
        self._stack: list[str] = []

    def rule(self, name: str) -> str:
        if name in self._done:
            return self._done[name]
        if name in self._stack:
            cycle = " -> ".join(self._stack[self._stack.index(name):] + [name])
            raise GrammarError(PARAM, INVALID_GRAMMAR,
                               f"rule '{name}' is recursive ({cycle}); the outlines backend compiles only "
                               "grammars without recursion: use grammar_backend llguidance or xgrammar")
        tree = self.rules.get(name)
        if tree is None:
            raise GrammarError(PARAM, INVALID_GRAMMAR, f"rule '{name}' is used but not defined")
        if isinstance(tree, str):  # a ready regex (_COMMON_OVERRIDES)
            return tree
        self._stack.append(name)
        terminal = name.lstrip("_")[:1].isupper()
        out = self.node(tree, None if terminal else self.ignore)
        self._stack.pop()
        self._done[name] = out
        return out

    def node(self, t: Any, gap: str | None) -> str:
        kind = getattr(t, "data", None)
        if kind == "expansions":
            return "(?:" + "|".join(self.node(c, gap) for c in t.children) + ")"
        if kind == "alias":
            return self.node(t.children[0], gap)
        if kind == "expansion":
            sep = f"(?:{gap})*" if gap else ""
            return "(?:" + sep.join(self.node(c, gap) for c in t.children) + ")"
        if kind == "expr":
            return self._repeat(self.node(t.children[0], gap), t.children[1], gap)
        if kind == "maybe":
            return f"(?:{self.node(t.children[0], gap)})?"
        if kind == "literal":
            return _literal(str(t.children[0]))
        if kind == "range":
            lo, hi = (_string_value(str(c)) for c in t.children)
            return f"[{_class_char(lo)}-{_class_char(hi)}]"
        if kind == "regexp":
            return _regexp(str(t.children[0]))
        if kind == "ref":
            return self.rule(str(t.children[0]))
        raise GrammarError(PARAM, INVALID_GRAMMAR, "unsupported grammar construct")

    def _repeat(self, inner: str, quant: Any, gap: str | None) -> str:
        parts = [str(c) for c in quant.children]
        item = f"(?:{inner}(?:{gap})*)" if gap else f"(?:{inner})"
        if len(parts) == 1 and parts[0] in ("*", "+", "?"):
            return item + parts[0]
        nums = [p for p in parts if p.isdigit()]
        if "," in parts or len(nums) == 2:
            hi = nums[1] if len(nums) == 2 else ""
            return f"{item}{{{nums[0]},{hi}}}"
        return f"{item}{{{nums[0]}}}"


def _string_value(token: str) -> str:
    import json

    body = token[:-1] if token.endswith("i") else token
    try:
        return json.loads(body)
    except ValueError:
        raise GrammarError(PARAM, INVALID_GRAMMAR, f"invalid string literal {body[:40]}") from None


def _literal(token: str) -> str:
    text = _string_value(token)
    if token.endswith("i"):
        return "(?i:" + escape_literal(text) + ")"
    return "(?:" + escape_literal(text) + ")"


def _class_char(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ch


def _regexp(token: str) -> str:
    body, flags = token[1:token.rindex("/")], token[token.rindex("/") + 1:]
    if re.search(r"\(\?<?[=!]|\\[1-9]", body):
        raise GrammarError(PARAM, INVALID_GRAMMAR, f"regex {token[:60]} uses look-around or a back-reference")
    body = body.replace("\\/", "/")
    unknown = set(flags) - set("is")
    if unknown:
        raise GrammarError(PARAM, INVALID_GRAMMAR, f"regex flag '{sorted(unknown)[0]}' is not supported")
    return f"(?{flags}:{body})" if flags else f"(?:{body})"


def ebnf_to_regex(spec: str, options: GrammarOptions) -> str:
    """One regex for the whole grammar (its `start` rule), or GrammarError (recursion named)."""
    rules, ignores, imports = _collect(_parse(ebnf_to_lark(spec, options)))
    common: dict[str, Any] = {**_common_rules(), **_COMMON_OVERRIDES} if imports else {}
    for name, local in imports:
        if name not in common:
            raise GrammarError(PARAM, INVALID_GRAMMAR, f"common.lark has no terminal '{name}'")
        rules.setdefault(local, common[name])
    if imports:
        for dep, tree in common.items():  # the imported terminals' own helpers (DIGIT for INT, ...)
            rules.setdefault(dep, tree)
    if "start" not in rules:
        raise GrammarError(PARAM, INVALID_GRAMMAR, "grammar has no start rule (`root ::=` / `start:`)")
    terminals = _Emitter(rules, None)
    ignore = "|".join(terminals.node(t, None) for t in ignores) or None
    regex = _Emitter(rules, ignore).rule("start")
    if ignore:
        regex = f"(?:{ignore})*{regex}(?:{ignore})*"
    return regex
