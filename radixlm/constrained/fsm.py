"""Token FSM over an outlines-core Index, with cached masks and the compressed FSM (forced strings).

Runs in the scheduler process. The Index is built from `(?:R)\\x00` over the real tokens plus one
synthetic token per byte (ids FAKE_BYTE_BASE + b, never allowed in masks). Why:
  * outlines-core 0.2.x drops a token whose bytes cross a match of R and end in a non-final state
    (regex-automata reports matches one byte late) and compiles alternations leftmost-first, so
    `a|ab` or `(ab)+` lose continuations. With the NUL end marker, R's own matches are never
    "match states", so every token path is kept: the token FSM is exact.
  * "R is complete here" <=> the NUL byte leads to a final state; that is when EOS is allowed.
  * The synthetic byte tokens make the Index also a byte-level DFA of R: a state whose only byte
    transition (NUL aside) is b, and which is not accepting, forces b. Following such bytes gives
    the singular path (compressed FSM) the matcher jumps over. It is the same automaton the tokens
    walk, so a forced string can never disagree with the token masks.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass

import torch

from radixlm.constrained.bitmask import CpuMask, additive_row, allowed_list, num_words, pack_ids
from radixlm.constrained.vocabulary import END_BYTE, FAKE_BYTE_BASE, TokenBytes

# A visited state's mask is cached as a full bool row, so filling a mask is one copy_ (~2-4 us even
# at 50k tokens; zero_ + index_fill_ costs 2-3x that). Rows cost vocab_size bytes each, so all
# grammars of the process share this budget (a grammar returns its share when it is freed); states
# visited beyond it fill from id lists: the allowed ids, or the complement when that is shorter.
ROW_BUDGET_BYTES = 256 << 20
# The per-step path (scheduler -> sampler) uses MaskRows instead: the packed bitmask (ceil(V/32) int32,
# 6 KB at 49k) plus a CPU layout (bitmask.py): the allowed-id list when at most MAX_LIST_IDS tokens are
# allowed (gathers cost ~6 ns a token, an additive row ~9 us), else an additive float row (4 V bytes).
# MaskRows are deduplicated per grammar (every state inside a JSON string shares one mask, so do the
# "digit or end" states, ...) and share a process-wide budget (packed words + additive rows; id lists
# are StateInfo's, kept anyway). Past it a state's MaskRow is rebuilt at each use and offers no
# additive row (the sampler then unpacks the bits).
PACKED_BUDGET_BYTES = 64 << 20
MAX_LIST_IDS = 512
MAX_FORCED_BYTES = 4096
_budget_lock = threading.Lock()
_budget_used = [0]
_packed_used = [0]


def _take_row_budget(nbytes: int) -> bool:
    return _take(_budget_used, nbytes, ROW_BUDGET_BYTES)


def _return_row_budget(nbytes: int) -> None:
    _give(_budget_used, nbytes)


def _take(used: list[int], nbytes: int, limit: int) -> bool:
    with _budget_lock:
        if used[0] + nbytes > limit:
            return False
        used[0] += nbytes
        return True


def _give(used: list[int], nbytes: int) -> None:
    with _budget_lock:
        used[0] -= nbytes


def _return_packed_budget_of(packed_bytes: list[int]) -> None:
    _give(_packed_used, packed_bytes[0])


@dataclass(frozen=True)
class StateInfo:
    accepting: bool
    num_real_tokens: int          # allowed tokenizer tokens, EOS excluded
    allowed_ids: torch.Tensor     # int64 [n]: the mask's True entries (EOS when accepting, or alone)
    next_bytes: tuple[int, ...]   # bytes 1..255 with a transition (the byte-level DFA)


@dataclass(frozen=True)
class MaskRow:
    """One state's mask in the per-step layouts (shared by every state with the same mask)."""

    packed: torch.Tensor  # int32 [ceil(vocab_size / 32)]; bits past vocab_size are 0
    cpu: CpuMask | None   # the same mask in a CPU layout (None: over budget and too many ids for a list)


def _return_row_budget_of(row_bytes: list[int]) -> None:
    _return_row_budget(row_bytes[0])


class TokenFSM:
    """Immutable automaton plus per-state caches; shared by all matchers of one compiled grammar."""

    def __init__(self, index, table: TokenBytes, vocab_size: int):
        self.index = index
        self.table = table
        self.vocab_size = vocab_size
        self.initial_state: int = index.get_initial_state()
        self._finals = frozenset(index.get_final_states())
        self._limit = min(vocab_size, table.num_tokens)
        # Filled lazily from the scheduler thread; a race would only compute an entry twice.
        self._info: dict[int, StateInfo] = {}
        self._rows: dict[int, torch.Tensor] = {}  # state -> bool [vocab_size]
        self._blocked: dict[int, torch.Tensor] = {}  # state -> int64 [m], once rows ran out
        self._row_bytes = [0]
        weakref.finalize(self, _return_row_budget_of, self._row_bytes)
        self._forced: dict[int, tuple[bytes, int]] = {}
        self._mask_rows: dict[int, MaskRow] = {}   # state -> its (deduplicated) MaskRow
        self._unique: dict[bytes, MaskRow] = {}    # digest of the packed words -> MaskRow
        self._packed_bytes = [0]
        weakref.finalize(self, _return_packed_budget_of, self._packed_bytes)

    def next_state(self, state: int, token_id: int) -> int | None:
        if not 0 <= token_id < self._limit or token_id == self.table.eos_token_id:
            return None
        return self.index.get_next_state(state, token_id)

    def info(self, state: int) -> StateInfo:
        hit = self._info.get(state)
        if hit is None:
            hit = self._info[state] = self._build_info(state)
        return hit

    def _build_info(self, state: int) -> StateInfo:
        tokens = self.index.get_allowed_tokens(state) or []
        eos = self.table.eos_token_id
        real = [t for t in tokens if t < self._limit and t != eos]
        fake = sorted(t - FAKE_BYTE_BASE for t in tokens if t >= FAKE_BYTE_BASE)
        end = self.index.get_next_state(state, FAKE_BYTE_BASE + END_BYTE) if END_BYTE in fake else None
        accepting = end is not None and end in self._finals
        # No token can follow (complete, or a dead end the sampler must not see as an empty mask):
        # only EOS, so the request ends cleanly.
        with_eos = (accepting or not real) and eos < self.vocab_size
        ids = torch.tensor(sorted(real + ([eos] if with_eos else [])), dtype=torch.int64)
        next_bytes = tuple(b for b in fake if b != END_BYTE)
        return StateInfo(accepting, len(real), ids, next_bytes)

    def fill_mask(self, state: int, mask: torch.Tensor) -> None:
        """mask (bool [n], any device) := allowed tokens of state; ids >= vocab_size stay False."""
        row = self._rows.get(state)
        exact = mask.shape[0] == self.vocab_size
        if row is not None and exact:
            mask.copy_(row)  # also CPU -> accelerator
            return
        if exact and mask.device.type == "cpu":
            self._fill_uncached(state, mask)
            return
        # Another width, or an accelerator mask (the id lists live on the CPU): go through a CPU row.
        if row is None:
            row = torch.empty(self.vocab_size, dtype=torch.bool)
            self._fill_uncached(state, row)
        n = min(mask.shape[0], self.vocab_size)
        mask[:n].copy_(row[:n])
        mask[n:] = False

    def _fill_uncached(self, state: int, mask: torch.Tensor) -> None:
        info = self.info(state)
        if _take_row_budget(self.vocab_size):
            self._row_bytes[0] += self.vocab_size
            row = self._rows[state] = torch.zeros(self.vocab_size, dtype=torch.bool)
            row[info.allowed_ids] = True
            mask.copy_(row)
        elif 2 * info.allowed_ids.numel() > self._limit:  # mostly allowed: write the complement
            mask.fill_(True)
            mask.index_fill_(0, self._blocked_ids(state, info), False)
            mask[self._limit:] = False  # ids the tokenizer does not have (model padding)
        else:
            mask.zero_()
            mask.index_fill_(0, info.allowed_ids, True)

    def _blocked_ids(self, state: int, info: StateInfo) -> torch.Tensor:
        hit = self._blocked.get(state)
        if hit is None:
            hit = self._blocked[state] = self._blocked_list(info)
        return hit

    # ---- the per-step layouts (see bitmask.py) ----------------------------------------------------------
    def mask_row(self, state: int) -> MaskRow:
        hit = self._mask_rows.get(state)
        if hit is None:
            hit = self._build_mask_row(state)
        return hit

    def fill_bitmask(self, state: int, words: torch.Tensor) -> None:
        """words (int32 [n], any device) := state's packed mask; words past the vocabulary are 0."""
        row = self.mask_row(state).packed
        if words.shape[0] == row.shape[0]:
            words.copy_(row)  # also CPU -> accelerator
            return
        n = min(words.shape[0], row.shape[0])
        words[:n].copy_(row[:n])
        words[n:] = 0

    def mask_table_stats(self) -> dict[str, int]:
        """Cached states, distinct masks among them, and the bytes the cache holds (packed + additive rows)."""
        return {"states": len(self._mask_rows), "rows": len(self._unique), "bytes": self._packed_bytes[0]}

    def _build_mask_row(self, state: int) -> MaskRow:
        info = self.info(state)
        packed = pack_ids(info.allowed_ids, num_words(self.vocab_size))
        key = hashlib.blake2b(packed.numpy().tobytes(), digest_size=16).digest()
        shared = self._unique.get(key)
        if shared is not None and torch.equal(shared.packed, packed):
            self._mask_rows[state] = shared
            return shared
        if info.allowed_ids.numel() <= MAX_LIST_IDS:
            cpu, cost = allowed_list(info.allowed_ids), packed.numel() * 4
        else:
            cpu, cost = None, packed.numel() * 4 + 4 * self.vocab_size
        if shared is None and _take(_packed_used, cost, PACKED_BUDGET_BYTES):
            if cpu is None:
                cpu = additive_row(info.allowed_ids, self.vocab_size)
            self._packed_bytes[0] += cost
            row = self._unique[key] = self._mask_rows[state] = MaskRow(packed, cpu)
            return row
        return MaskRow(packed, cpu)  # not cached: built again on the next use

    def _blocked_list(self, info: StateInfo) -> torch.Tensor:
        free = torch.ones(self._limit, dtype=torch.bool)
        free[info.allowed_ids[info.allowed_ids < self._limit]] = False
        return free.nonzero().flatten()

    def forced(self, state: int) -> tuple[bytes, int]:
        """The singular path from state: (bytes every continuation starts with, state after them)."""
        hit = self._forced.get(state)
        if hit is not None:
            return hit
        path: list[int] = []
        states = [state]
        seen = {state}
        cur = state
        while len(path) < MAX_FORCED_BYTES:
            info = self.info(cur)
            if info.accepting or len(info.next_bytes) != 1:
                break
            nxt = self.index.get_next_state(cur, FAKE_BYTE_BASE + info.next_bytes[0])
            if nxt is None or nxt in seen:  # a forced cycle never reaches an end: stop before it
                break
            path.append(info.next_bytes[0])
            cur = nxt
            seen.add(cur)
            states.append(cur)
        # Every state on the path has the rest of the path as its own singular path.
        for i, s in enumerate(states):
            self._forced.setdefault(s, (bytes(path[i:]), cur))
        return self._forced[state]
