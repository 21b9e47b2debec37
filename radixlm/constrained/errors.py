"""Grammar errors: 400-class ValueErrors that name the offending field or keyword.

Runs wherever a grammar is validated or compiled (compile workers, scheduler, HTTP process). The codes
are the `code` values of the error envelope in docs/robustness.md.
"""

from __future__ import annotations

INVALID_GRAMMAR = "invalid_grammar"
GRAMMAR_TOO_LARGE = "grammar_too_large"
GRAMMAR_TIMEOUT = "grammar_timeout"
ERROR_CODES = (INVALID_GRAMMAR, GRAMMAR_TOO_LARGE, GRAMMAR_TIMEOUT)


class GrammarError(ValueError):
    """A grammar spec cannot be used. `param` is the request field (regex, json_schema, choices, ...),
    `code` one of ERROR_CODES, `message` a short text without paths or tracebacks."""

    def __init__(self, param: str, code: str, message: str):
        if code not in ERROR_CODES:
            raise AssertionError(f"unknown grammar error code {code!r}")
        super().__init__(f"{param}: {message}")
        self.param = param
        self.code = code
        self.message = message

    def to_dict(self) -> dict[str, str]:
        """Plain fields, so the error can cross a process as JSON (never pickled)."""
        return {"param": self.param, "code": self.code, "message": self.message}

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> "GrammarError":
        return cls(str(d["param"]), str(d["code"]), str(d["message"]))
