"""Where in the user's program an expression was appended, for error messages.

Runs in the user's process, in the program thread: the origin is captured when `s += ...` runs and
attached (as an exception note) when the worker thread later fails on that expression.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass

_LANG_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Origin:
    """Where in the user's program an expression was appended."""

    filename: str
    lineno: int
    function: str

    def describe(self) -> str:
        source = linecache.getline(self.filename, self.lineno).strip()
        return f'radixlm program line: File "{self.filename}", line {self.lineno}, in {self.function}\n    {source}'


def caller_origin() -> Origin | None:
    """The innermost frame outside radixlm.lang and contextlib: the program line doing `s += ...`."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_LANG_DIR) and os.path.basename(path) != "contextlib.py":
            return Origin(path, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


def annotate(error: BaseException, origin: Origin | None) -> BaseException:
    if origin is not None and not getattr(error, "radixlm_origin", None):
        error.add_note(origin.describe())
        error.radixlm_origin = origin  # type: ignore[attr-defined]
    return error
