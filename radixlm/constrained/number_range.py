"""Regexes for JSON numbers inside bounds (JSON Schema minimum / maximum / exclusive*).

Runs in compile workers. outlines-core ignores numeric bounds, so json_schema.py swaps bounded
integers/numbers for these regexes. No maintained Python library does this (range-regex was last
released in 2013), hence the small digit-by-digit construction here; tests check it against `<=`.
Numbers with bounds are produced without exponent (a subset of valid JSON numbers: always sound).
"""

from __future__ import annotations

_FRAC = r"(?:\.[0-9]+)?"
_NONZERO_FRAC = r"\.[0-9]*[1-9][0-9]*"
_ZERO_FRAC = r"(?:\.0+)?"


def _same_len(lo: str, hi: str) -> str:
    """Regex for the decimal strings of every integer in [lo, hi]; lo and hi have the same length."""
    if lo == hi:
        return lo
    if len(lo) == 1:
        return f"[{lo}-{hi}]"
    if lo[0] == hi[0]:
        return lo[0] + _group(_same_len(lo[1:], hi[1:]))
    rest = len(lo) - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return f"[{lo[0]}-{hi[0]}][0-9]{{{rest}}}"
    parts = [lo[0] + _group(_same_len(lo[1:], "9" * rest))]
    first, last = int(lo[0]) + 1, int(hi[0]) - 1
    if first <= last:
        parts.append(f"[{first}-{last}][0-9]{{{rest}}}")
    parts.append(hi[0] + _group(_same_len("0" * rest, hi[1:])))
    return "|".join(parts)


def _group(regex: str) -> str:
    return f"(?:{regex})" if "|" in regex else regex


def int_range_regex(lo: int, hi: int | None) -> str:
    """Non-negative integers in [lo, hi] (hi None: unbounded), written without leading zeros."""
    if lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"bad range [{lo}, {hi}]")
    parts = []
    top = len(str(hi)) if hi is not None else len(str(lo))
    for digits in range(len(str(lo)), top + 1):
        a = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        b = 10**digits - 1 if hi is None else min(hi, 10**digits - 1)
        if a <= b:
            parts.append(_same_len(str(a), str(b)))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{top},}}")
    return "|".join(_group(p) for p in parts)


def _nonneg(lo: int, lo_excl: bool, hi: int | None, hi_excl: bool, integer: bool) -> str | None:
    """Regex for non-negative JSON numbers y with lo <(=) y <(=) hi, bounds integral; None if empty."""
    if integer:
        a, b = lo + lo_excl, (None if hi is None else hi - hi_excl)
        return None if b is not None and a > b else int_range_regex(a, b)
    if hi is not None and (hi < lo or (hi == lo and (lo_excl or hi_excl))):
        return None
    if hi is not None and hi == lo:
        return f"{lo}{_ZERO_FRAC}"
    parts = []
    if lo_excl:
        parts.append(f"{lo}{_NONZERO_FRAC}")
    a, b = lo + lo_excl, (None if hi is None else hi - 1)
    if b is None or a <= b:
        parts.append(f"(?:{int_range_regex(a, b)}){_FRAC}")
    if hi is not None and not hi_excl:
        parts.append(f"{hi}{_ZERO_FRAC}")
    return "|".join(parts)


def bounded_number_regex(lo: int | None, lo_excl: bool, hi: int | None, hi_excl: bool,
                         integer: bool) -> str | None:
    """JSON numbers x with lo <(=) x <(=) hi (None: unbounded); None if the interval is empty."""
    parts = []
    if hi is None or hi >= 0:
        if lo is not None and lo >= 0:
            pos = _nonneg(lo, lo_excl, hi, hi_excl, integer)
        else:
            pos = _nonneg(0, False, hi, hi_excl, integer)
        if pos:
            parts.append(f"(?:{pos})")
    if lo is None or lo < 0:
        # x = -y with y > 0 (zero belongs to the non-negative part, so "-0" is never produced).
        if hi is not None and hi < 0:
            y_lo, y_lo_excl = -hi, hi_excl
        else:
            y_lo, y_lo_excl = 0, True
        neg = _nonneg(y_lo, y_lo_excl, None if lo is None else -lo, lo_excl, integer)
        if neg:
            parts.append(f"-(?:{neg})")
    return "|".join(parts) if parts else None
