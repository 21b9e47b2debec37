"""Errors a client can cause. They subclass ValueError; the server maps them to a 400 with `param` and
`code` (robustness.md). Runs in any process.

`from_validation_error` is the one place a msgspec type error (an HTTP body, or a Python dict given to
the Engine, decoded into a Struct) becomes such an error, naming the field.
"""

from __future__ import annotations

import re

import msgspec


class InvalidRequestError(ValueError):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.code = code


class ContextLengthError(InvalidRequestError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, param, code="context_length_exceeded")


# msgspec's messages: "<what> - at `$.a[0].b`", "<what> - at `key` in `$.a`", or "<what>" at the root.
_LOCATED = re.compile(r"^(?P<what>.*?)(?: - at `(?P<path>[^`]*)`(?: in `(?P<outer>[^`]*)`)?)?$", re.S)
_NAMED_FIELD = re.compile(r"(unknown|missing required) field `([^`]*)`")
# Objects whose fields a client thinks of as top-level parameters (`temperature`, not sampling_params.temperature).
_TRANSPARENT = ("sampling_params",)


def from_validation_error(exc: msgspec.ValidationError) -> InvalidRequestError:
    """`param` is the outermost named field (`messages` for `$.messages[0].role`), looking through
    sampling_params; the message names the whole location: "`temperature`: Expected `float`, got `str`"."""
    m = _LOCATED.match(str(exc))
    what, path, in_key = m["what"], m["outer"] or m["path"] or "$", m["outer"] is not None
    location = path[2:] if path.startswith("$.") else path[1:]
    named = _NAMED_FIELD.search(what)
    if named:
        location = f"{location}.{named.group(2)}" if location else named.group(2)
        what = f"{named.group(1)} field"
    for prefix in _TRANSPARENT:
        location = re.sub(rf"^{prefix}(\[\d+\])?\.?", "", location)
    param = re.split(r"[.\[]", location, maxsplit=1)[0] or None
    what = what.replace(" | null", "")  # optional fields: null is the default, not what was wrong
    if in_key:
        what += " (in a key)"
    return InvalidRequestError(f"`{location}`: {what}" if location else what, param=param, code="invalid_type")
