"""A user `regex` constraint's `\\d`, `\\w`, `\\s` (and `\\D`, `\\W`, `\\S`) as ASCII classes, what they mean
under Python's `re.ASCII` and on SGLang's other grammar backends.

Runs in compile workers, before a regex reaches llguidance, xgrammar or outlines-core: their regex engines
read these escapes as Unicode classes, so `\\d{3}` could produce '٣٣٣'. The rewrite follows the pattern's
structure: an escaped backslash (`\\\\d`) is a literal, and inside a class (`[\\d.]`, `[^\\s]`) the escape
becomes the class's ASCII members; a complemented escape inside a class (`[\\D.]`) turns the class into
the complement of a finite ASCII set. Everything else is copied unchanged, so a regex without these
escapes reaches the backend as written (JSON-schema `pattern`s are translated by ecma_regex.py instead).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

_SETS = {"d": string.digits, "w": string.ascii_letters + string.digits + "_", "s": " \t\n\r\f\v"}
_EVERYTHING, _NOTHING = r"[\s\S]", r"[^\s\S]"


def ascii_classes(pattern: str) -> str:
    """The pattern with its class escapes made ASCII (unchanged when it has none)."""
    if "\\" not in pattern:
        return pattern
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(_escape_outside(pattern[i + 1]))
            i += 2
        elif ch == "[":
            cls = _read_class(pattern, i)
            if cls is None:  # unterminated: the backend reports it
                out.append(pattern[i:])
                break
            out.append(cls.render())
            i = cls.end
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _escape_outside(c: str) -> str:
    if c.lower() not in _SETS:
        return "\\" + c
    body = _class_body(_SETS[c.lower()])
    return f"[^{body}]" if c.isupper() else f"[{body}]"


@dataclass
class _Class:
    """A bracket class read with Python's rules: a `]` right after `[` or `[^` is a literal."""

    text: str  # as written, brackets included
    negated: bool
    end: int  # index just past the closing `]`
    parts: list[str] = field(default_factory=list)  # members in order: as written, or "\\d" etc. for an escape

    def render(self) -> str:
        escapes = [p[1] for p in self.parts if _is_class_escape(p)]
        if not escapes:
            return self.text
        rest = self._members()
        complemented = [e.lower() for e in escapes if e.isupper()]
        if not complemented:
            return f"[{'^' if self.negated else ''}{rest}]"
        excluded = _excluded(complemented, rest)
        if excluded is None:
            return self.text  # the other members are not Python syntax: leave the class to the backend
        # the members are every character but `excluded`; a negated class is then just `excluded`
        if self.negated:
            return f"[{_class_body(excluded)}]" if excluded else _NOTHING
        return f"[^{_class_body(excluded)}]" if excluded else _EVERYTHING

    def _members(self) -> str:
        """The members as a class body: positive escapes spelled out (a `-` after one stays a literal)."""
        out, after_escape = [], False
        for part in self.parts:
            if _is_class_escape(part):
                if part[1].islower():
                    out.append(_class_body(_SETS[part[1]]))
                after_escape = True
                continue
            out.append("\\-" if part == "-" and after_escape else part)
            after_escape = False
        return "".join(out)


def _is_class_escape(part: str) -> bool:
    return len(part) == 2 and part[0] == "\\" and part[1].lower() in _SETS


def _excluded(complemented: list[str], rest: str) -> str | None:
    """The ASCII characters in none of a class's members (a subset of each complemented escape's set), or
    None when the other members (`rest`) are not Python syntax."""
    candidates = set.intersection(*(set(_SETS[k]) for k in complemented))
    try:
        member = re.compile(f"[{rest}]") if rest else None
    except re.error:
        return None
    return "".join(sorted(c for c in candidates if member is None or not member.fullmatch(c)))


def _read_class(pattern: str, start: int) -> _Class | None:
    j = start + 1
    negated = pattern.startswith("^", j)
    j += negated
    cls, first = _Class("", negated, 0), True
    while j < len(pattern):
        ch = pattern[j]
        if ch == "]" and not first:
            cls.text, cls.end = pattern[start:j + 1], j + 1
            return cls
        first = False
        width = 2 if ch == "\\" and j + 1 < len(pattern) else 1
        cls.parts.append("\\]" if ch == "]" else pattern[j:j + width])
        j += width
    return None


def _class_body(chars: str) -> str:
    """Characters written for inside a class, runs of consecutive letters or digits as ranges."""
    codes = sorted(set(map(ord, chars)))
    parts, k = [], 0
    while k < len(codes):
        run = k
        while run + 1 < len(codes) and codes[run + 1] == codes[run] + 1 and chr(codes[run + 1]).isalnum():
            run += 1
        if run - k >= 2 and chr(codes[k]).isalnum():
            parts.append(f"{_item(chr(codes[k]))}-{_item(chr(codes[run]))}")
        else:
            parts.extend(_item(chr(c)) for c in codes[k:run + 1])
        k = run + 1
    return "".join(parts)


def _item(ch: str) -> str:
    if ch.isalnum() or ch in "_ ":
        return ch
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else "\\" + ch
