"""ECMA-262 `pattern`s (JSON Schema) -> the regex dialect of a grammar library.

Runs in compile workers. JSON Schema patterns are ECMA-262 regexes that *search* the decoded string.
The libraries want a full match in their own dialect, so each top-level alternative gets a free
prefix / suffix where it is not anchored. What a regex engine cannot express (look-around,
back-references, word boundaries, anchors inside groups) is dropped or widened: the result is looser,
never stricter, and each such part is reported so the finished output is validated afterwards.

`json_string=True` (outlines: the regex matches the JSON *encoding* of the string, between the quotes):
literal `"`, `\\` and control characters are written as their JSON escapes and classes never admit
them raw, so every match is a valid JSON string body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# JSON string body characters that need no escape, and the escapes we generate for the others.
_JSON_PLAIN = r'[^"\\\x00-\x1f]'
FREE_JSON_CHARS = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*'
_SPECIAL_ESCAPES = {'"': r'\\"', "\\": r"\\\\", "\n": r"\\n", "\t": r"\\t", "\r": r"\\r",
                    "\b": r"\\b", "\f": r"\\f"}
_CLASS_ESCAPES = {"d": "0-9", "w": "A-Za-z0-9_", "s": r" \t\n\r\f\v\u00a0\u2028\u2029\ufeff"}
_CONTROL = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\x00"}
_META = set(r"\.+*?()|[]{}^$#&-~")
_QUANT = re.compile(r"\{\d+(?:,\d*)?\}")
MAX_REPEAT = 64  # larger counted repetitions become open-ended (outlines and xgrammar build automata eagerly)
MAX_REPEAT_LAZY = 4096  # llguidance's lexer builds states lazily: `{1,256}` stays exact (bench_grammar)


@dataclass
class _Out:
    json_string: bool
    unicode_classes: bool
    max_repeat: int = MAX_REPEAT
    dropped: list[str] = field(default_factory=list)


def _char_code(ch: str) -> str:
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _literal(ch: str, out: _Out) -> str:
    if out.json_string and (ch in _SPECIAL_ESCAPES or ord(ch) < 0x20):
        return _SPECIAL_ESCAPES.get(ch, f"\\\\u{ord(ch):04x}")
    if ch in _META:
        return "\\" + ch
    if ord(ch) < 0x20 or ord(ch) > 0x7E:
        return _char_code(ch)
    return ch


def _class_item(ch: str) -> str:
    """A single character written for inside a class (valid for Python `re` and Rust regex)."""
    if ch in "\\]^-[&~" or ord(ch) < 0x20 or ord(ch) > 0x7E:
        return _char_code(ch) if ch not in "\\]^-[&~" else "\\" + ch
    return ch


def _render_class(body: str, negated: bool, out: _Out) -> str:
    """A class (`body` in Python/Rust syntax); in json_string mode specials go through escapes."""
    cls = f"[{'^' if negated else ''}{body}]"
    if not out.json_string:
        return cls
    try:
        probe = re.compile(cls)
    except re.error:
        probe = None
    specials = [c for c in _SPECIAL_ESCAPES if probe is not None and probe.fullmatch(c)]
    if probe is not None and not specials and not any(probe.fullmatch(chr(c)) for c in range(0x20)):
        return cls
    plain = f"[{cls}&&{_JSON_PLAIN}]"
    return "(?:" + "|".join([plain] + [_SPECIAL_ESCAPES[c] for c in specials]) + ")"


def _escape(pattern: str, i: int, out: _Out) -> tuple[str, str, int]:
    """(kind, text, next index) for the escape at pattern[i] == '\\': kind "class" (text is a class
    body, valid inside [...] for Python `re` and Rust regex), "negclass" (its complement) or "char"."""
    if i + 1 >= len(pattern):
        return "char", "\\", i + 1
    c = pattern[i + 1]
    if c.lower() in _CLASS_ESCAPES:
        return ("negclass" if c.isupper() else "class"), _CLASS_ESCAPES[c.lower()], i + 2
    if c in "pP" and i + 2 < len(pattern) and pattern[i + 2] == "{":
        end = pattern.find("}", i)
        if end > 0 and out.unicode_classes:
            return "class", f"\\{c}{pattern[i + 2:end + 1]}", end + 1
        out.dropped.append(f"\\{c}{{..}} widened to any character")
        return "class", "\\s\\S", (end + 1 if end > 0 else i + 2)
    if c in _CONTROL:
        return "char", _CONTROL[c], i + 2
    if c == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", pattern[i + 2:i + 4]):
        return "char", chr(int(pattern[i + 2:i + 4], 16)), i + 4
    if c == "u":
        m = re.match(r"\{([0-9a-fA-F]{1,6})\}|([0-9a-fA-F]{4})", pattern[i + 2:])
        if m:
            return "char", chr(int(m.group(1) or m.group(2), 16)), i + 2 + m.end()
    if c == "c" and i + 2 < len(pattern) and pattern[i + 2].isalpha():
        return "char", chr(ord(pattern[i + 2]) % 32), i + 3
    return "char", c, i + 2  # identity escape: the character itself


def _parse_class(pattern: str, i: int, out: _Out) -> tuple[str, int]:
    """The class starting at pattern[i] == '[' -> (regex, next index)."""
    j = i + 1
    negated = j < len(pattern) and pattern[j] == "^"
    j += negated
    parts: list[str] = []
    while j < len(pattern) and pattern[j] != "]":
        if pattern[j] == "\\":
            kind, text, j = _escape(pattern, j, out)
            if kind == "char" and text == "b":
                text = "\b"  # inside a class ECMA `\b` is backspace
            parts.append(_class_item(text) if kind == "char" else
                         text if kind == "class" else {"0-9": "\\D", "A-Za-z0-9_": "\\W"}.get(text, "\\S"))
        else:
            parts.append("-" if pattern[j] == "-" and parts and j + 1 < len(pattern) and pattern[j + 1] != "]"
                         else _class_item(pattern[j]))
            j += 1
    body = "".join(parts)
    if not body:  # ECMA `[]` matches nothing, `[^]` any character
        return (_render_class("\\u0000-\\U0010ffff", False, out) if negated else "[^\\u0000-\\U0010ffff]"), j + 1
    return _render_class(body, negated, out), j + 1


def _group_end(pattern: str, i: int) -> int:
    """Index just past the `)` that closes the group opened at pattern[i]."""
    depth, j, in_class = 0, i, False
    while j < len(pattern):
        ch = pattern[j]
        if ch == "\\":
            j += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(pattern)


def _quantifier(text: str, out: _Out) -> str:
    """`{n,m}` with a large bound grows every automaton by that many copies: widen it (looser)."""
    lo, _, hi = text[1:-1].partition(",")
    big = int(lo) > out.max_repeat or (hi != "" and int(hi) > out.max_repeat)
    if not big:
        return text
    out.dropped.append(f"repetition {text} widened")
    return f"{{{min(int(lo), out.max_repeat)},}}"


def _any_char(out: _Out) -> str:
    if out.json_string:
        return r'(?:[^"\\\x00-\x1f\u2028\u2029]|\\["\\/bft])'
    return "[^\\n\\r\\u2028\\u2029]"


def _translate(pattern: str, out: _Out) -> str:
    res: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            c = pattern[i + 1] if i + 1 < len(pattern) else ""
            if c.isdigit() and c != "0" or (c == "k" and pattern[i + 2:i + 3] == "<"):
                end = pattern.find(">", i) + 1 if c == "k" else i + 1 + len(re.match(r"\d+", pattern[i + 1:]).group())
                out.dropped.append("back-reference widened")
                res.append(f"(?:{FREE_JSON_CHARS if out.json_string else '.*'})")
                i = end
                continue
            if c in "bB":
                out.dropped.append("word boundary dropped")
                i += 2
                continue
            kind, text, i = _escape(pattern, i, out)
            res.append(_literal(text, out) if kind == "char" else _render_class(text, kind == "negclass", out))
        elif ch == "[":
            text, i = _parse_class(pattern, i, out)
            res.append(text)
        elif ch == "(":
            if pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
                out.dropped.append("look-around dropped")
                i = _group_end(pattern, i)
                if i < len(pattern) and pattern[i] in "*+?{":  # a quantified assertion: drop it too
                    i += len(_QUANT.match(pattern, i).group()) if pattern[i] == "{" and _QUANT.match(pattern, i) else 1
                continue
            if pattern.startswith("(?<", i):
                i = pattern.find(">", i) + 1
            elif pattern.startswith("(?:", i):
                i += 3
            else:
                i += 1
            res.append("(?:")
        elif ch == ".":
            res.append(_any_char(out))
            i += 1
        elif ch in "^$":
            out.dropped.append(f"anchor '{ch}' inside the pattern dropped")
            i += 1
        elif ch == "{":
            m = _QUANT.match(pattern, i)
            res.append(_quantifier(m.group(), out) if m else "\\{")
            i = m.end() if m else i + 1
        elif ch == "}":
            res.append("\\}")
            i += 1
        elif ch in "*+?" and i + 1 < len(pattern) and pattern[i + 1] == "?":
            res.append(ch)  # lazy quantifiers match the same strings
            i += 2
        elif ch in "*+?)|":
            res.append(ch)
            i += 1
        else:
            res.append(_literal(ch, out))
            i += 1
    return "".join(res)


def _top_level_alternatives(pattern: str) -> list[str]:
    parts, depth, start, j, in_class = [], 0, 0, 0, False
    while j < len(pattern):
        ch = pattern[j]
        if ch == "\\":
            j += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(pattern[start:j])
            start = j + 1
        j += 1
    parts.append(pattern[start:])
    return parts


def _python_anchors(branch: str) -> str:
    """`\\A...\\Z` (Python's and PCRE's anchors, common in schemas written by Python tools such as
    cfn-lint's AWS schemas) as `^...$`: ECMA-262 has no such escapes (an error under the `u` flag), so
    their authors can only have meant the anchors, and the output validator reads them the same way."""
    if branch.startswith("\\A"):
        branch = "^" + branch[2:]
    if branch.endswith(("\\Z", "\\z")) and _ends_with_anchor(branch[:-2] + "$"):
        branch = branch[:-2] + "$"
    return branch


def _ends_with_anchor(branch: str) -> bool:
    if not branch.endswith("$"):
        return False
    head = branch[:-1]
    return (len(head) - len(head.rstrip("\\"))) % 2 == 0  # `\$` is a literal dollar


def translate_pattern(pattern: str, json_string: bool, unicode_classes: bool = True,
                      search: bool = False, max_repeat: int = MAX_REPEAT) -> tuple[str, tuple[str, ...]]:
    """(regex, what was widened) for an ECMA-262 search pattern: a full-match regex, or with
    `search` (llguidance applies patterns as JSON Schema does) one that keeps the pattern's anchors."""
    out = _Out(json_string, unicode_classes, max_repeat)
    free = FREE_JSON_CHARS if json_string else r"[\s\S]*"
    branches = []
    for branch in _top_level_alternatives(pattern):
        branch = _python_anchors(branch)
        head = branch.startswith("^")
        tail = _ends_with_anchor(branch)
        core = branch[1 if head else 0:len(branch) - 1 if tail else len(branch)]
        body = _translate(core, out)
        if search:
            branches.append(("^" if head else "") + f"(?:{body})" + ("$" if tail else ""))
            continue
        branches.append(("" if head else free) + f"(?:{body})" + ("" if tail else free))
    regex = branches[0] if len(branches) == 1 else "|".join(f"(?:{b})" for b in branches)
    return regex, tuple(dict.fromkeys(out.dropped))
