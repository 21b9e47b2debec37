"""Errors a client can cause. They subclass ValueError; the server maps them to a 400 with `param` and
`code` (robustness.md). Runs in any process."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.code = code


class ContextLengthError(InvalidRequestError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, param, code="context_length_exceeded")
