"""An incremental JSON reader over the bytes a constrained request has generated, that knows which arrays
must hold unique items and which items they already hold, and where each number starts and ends.

Runs in the scheduler process, inside unique_items.py's and number_layer.py's matchers. The grammar
guarantees the text is a prefix of valid JSON, so this reader only tracks structure (no error recovery).
Item values are read back with `json.loads` from the text when they complete; snapshots are cheap (frames
are small, `seen` sets are immutable) so the matcher can keep one per token for rollback and try
candidate tokens on a copy.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.schema_scope import SchemaScope, Scope

WS = frozenset(b" \t\n\r")
NUMBER_BYTES = frozenset(b"0123456789+-.eE")
LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}

# Reader modes.
VALUE, AFTER, KEY, COLON, STR, STR_ESC, NUM, LIT, DONE = range(9)


class Frame:
    __slots__ = ("is_obj", "scope", "unique", "seen", "values", "start", "index", "key")

    def __init__(self, is_obj: bool, scope: Scope, unique: bool):
        self.is_obj, self.scope, self.unique = is_obj, scope, unique
        self.seen: frozenset = frozenset()  # value_key of each item so far
        self.values: tuple = ()             # the items themselves (lookahead follows paths into them)
        self.start = -1      # where the current item began (arrays)
        self.index = 0       # items completed so far (arrays)
        self.key: str | None = None

    def copy(self) -> "Frame":
        twin = Frame(self.is_obj, self.scope, self.unique)
        twin.seen, twin.values, twin.start, twin.index, twin.key = (self.seen, self.values, self.start, self.index,
                                                                    self.key)
        return twin


def value_key(value: Any) -> Any:
    """A hashable key under which two JSON values collide iff JSON Schema calls them equal (1 == 1.0,
    true != 1, objects regardless of member order)."""
    if isinstance(value, bool) or value is None:
        return ("c", value)
    if isinstance(value, (int, float)):
        return ("n", int(value) if isinstance(value, float) and value.is_integer() else value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("a", tuple(value_key(v) for v in value))
    return ("o", frozenset((k, value_key(v)) for k, v in value.items()))


class JsonStream:
    """Reads text as it is generated. `duplicate` turns True when an item completes in a unique array
    that already holds an equal item (the caller decides what that means)."""

    def __init__(self, scope: SchemaScope | None):
        self._scope = scope  # None: no unique arrays (number_layer.py reads numbers only)
        self.text = bytearray()
        self.stack: list[Frame] = []
        self.mode = VALUE
        self.key_string = False   # the string being read is an object key
        self.str_start = -1
        self.lit_left = b""
        self.duplicate = False
        self.num_start = -1       # where the number being read (or the last one) began
        self.finished: list | None = None  # when a list: (value_path(), text) of each number that ends

    # ---- snapshots ----------------------------------------------------------------------------------
    def state(self) -> tuple:
        return (len(self.text), [f.copy() for f in self.stack], self.mode, self.key_string, self.str_start,
                self.lit_left, self.duplicate, self.num_start)

    def restore(self, state: tuple) -> None:
        n, stack, self.mode, self.key_string, self.str_start, self.lit_left, self.duplicate, self.num_start = state
        del self.text[n:]
        self.stack = [f.copy() for f in stack]

    # ---- reading ------------------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        base = len(self.text)
        self.text += data
        for i, b in enumerate(data):
            self._step(b, base + i)

    def pending_unique(self) -> Frame | None:
        """The innermost unique array that already holds an item (a duplicate is possible), or None."""
        for frame in reversed(self.stack):
            if frame.unique and frame.seen:
                return frame
        return None

    def partial_string(self, frame: Frame) -> bytes | None:
        """The raw bytes so far (after the opening quote) of `frame`'s current item when that item is a
        string being read outside an escape, else None."""
        if frame is not self.stack[-1] or self.mode != STR or self.key_string:
            return None
        return bytes(self.text[self.str_start + 1:])

    def partial_scalar(self) -> tuple[str, bytes] | None:
        """("s", raw bytes after the quote) of a string value being read outside an escape, ("n", bytes
        so far) of a number being read, else None."""
        if self.mode == STR and not self.key_string:
            return "s", bytes(self.text[self.str_start + 1:])
        if self.mode == NUM:
            top = self.stack[-1] if self.stack else None
            start = top.start if top is not None and not top.is_obj else self._number_start()
            return "n", bytes(self.text[start:])
        return None

    def value_path(self) -> tuple:
        """Keys and indices from the root to the value being read (None for a key that did not read)."""
        return tuple(f.key if f.is_obj else f.index for f in self.stack)

    def partial_number(self) -> bytes | None:
        """The bytes so far of the number being read, else None."""
        return bytes(self.text[self.num_start:]) if self.mode == NUM else None

    def path_in_item(self, frame: Frame) -> list | None:
        """Keys and indices from `frame`'s current item down to the value being read (None: a key)."""
        at = next(i for i, f in enumerate(self.stack) if f is frame)
        path = []
        for f in self.stack[at + 1:]:
            if f.is_obj and f.key is None:
                return None
            path.append(f.key if f.is_obj else f.index)
        return path

    def _number_start(self) -> int:
        i = len(self.text)
        while i > 0 and self.text[i - 1] in NUMBER_BYTES:
            i -= 1
        return i

    def _step(self, b: int, pos: int) -> None:
        mode = self.mode
        if mode == STR:
            if b == 0x5C:  # backslash
                self.mode = STR_ESC
            elif b == 0x22:
                self._end_string(pos + 1)
        elif mode == STR_ESC:
            self.mode = STR
        elif mode == NUM:
            if b not in NUMBER_BYTES:
                if self.finished is not None:
                    self.finished.append((self.value_path(), bytes(self.text[self.num_start:pos])))
                self._complete(pos)
                self._step(b, pos)
        elif mode == LIT:
            self.lit_left = self.lit_left[1:]
            if not self.lit_left:
                self._complete(pos + 1)
        elif b in WS:
            return
        elif mode == VALUE:
            if b == 0x5D and self.stack and not self.stack[-1].is_obj:  # `]` of an empty array
                self._close(pos)
            else:
                self._start_value(b, pos)
        elif mode == AFTER:
            if b == 0x2C:  # comma
                self.mode = KEY if self.stack[-1].is_obj else VALUE
            elif b in (0x7D, 0x5D):
                self._close(pos)
        elif mode == KEY:
            if b == 0x22:
                self.mode, self.key_string, self.str_start = STR, True, pos
            elif b == 0x7D:
                self._close(pos)
        elif mode == COLON and b == 0x3A:
            self.mode = VALUE

    def _start_value(self, b: int, pos: int) -> None:
        top = self.stack[-1] if self.stack else None
        if top is not None and not top.is_obj:
            top.start = pos
        if b == 0x22:
            self.mode, self.key_string, self.str_start = STR, False, pos
        elif b in (0x7B, 0x5B):
            self._open(b == 0x7B, top)
        elif b in LITERALS:
            self.mode, self.lit_left = LIT, LITERALS[b]
        else:
            self.mode, self.num_start = NUM, pos

    def _open(self, is_obj: bool, parent: Frame | None) -> None:
        scope = self._child_scope(parent) if self._scope is not None else None
        unique = not is_obj and SchemaScope.requires(scope, "array", "uniqueItems")
        self.stack.append(Frame(is_obj, scope, unique))
        self.mode = KEY if is_obj else VALUE

    def _child_scope(self, parent: Frame | None) -> Scope:
        if parent is None:
            return self._scope.root()
        if parent.is_obj:
            return None if parent.key is None else self._scope.member(parent.scope, parent.key)
        return self._scope.item(parent.scope, parent.index)

    def _end_string(self, end: int) -> None:
        if self.key_string:
            try:
                self.stack[-1].key = json.loads(bytes(self.text[self.str_start:end]))
            except (ValueError, RecursionError):  # never for grammar-valid text; then this key's scope is unknown
                self.stack[-1].key = None
            self.key_string, self.mode = False, COLON
        else:
            self._complete(end)

    def _close(self, pos: int) -> None:
        self.stack.pop()
        self._complete(pos + 1)

    def _complete(self, end: int) -> None:
        """A value ended at `end` (exclusive): record it if it is an item of a unique array."""
        if not self.stack:
            self.mode = DONE
            return
        top = self.stack[-1]
        self.mode = AFTER
        if top.is_obj:
            return
        if top.unique:
            try:
                value = json.loads(bytes(self.text[top.start:end]))
                key = value_key(value)
            except (ValueError, RecursionError):  # never for grammar-valid text; an unreadable item is not compared
                key = None
            if key is not None and key in top.seen:
                self.duplicate = True
            elif key is not None:
                top.seen, top.values = top.seen | {key}, top.values + (value,)
        top.index += 1
