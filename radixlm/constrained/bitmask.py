"""Per-step grammar masks in the layouts the sampler applies fastest: packed int32 bitmask rows, and for
the CPU, allowed-id lists and additive rows.

Runs in the scheduler process (the GrammarManager builds a batch's masks, the sampler applies them) and
in tests / benchmarks. The layouts, one meaning ("token t may be sampled"):
  * bitmask: int32 [B, ceil(W/32)], bit j of word w set <=> token 32w + j allowed. The layout of
    radixlm/kernels/grammar_mask.py (Triton) and of xgrammar, so on CUDA a batch is one pinned host
    buffer, one copy and one kernel launch.
  * CpuMask: on the CPU, unpacking bits and every boolean-masked op over a 49k row (masked_fill, where)
    cost 50-300 us on the development machine (branchy, not vectorised; bench_grammar.py), 5-30x the
    target. A JSON state typically allows ~10 tokens, so a mask that allows few tokens is its id list
    (gather them, -inf elsewhere: a few us), and one that allows many is an additive float row of 0 /
    -inf (one vectorised add, ~9 us). Backends that cache masks per state (outlines) hand these over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

if TYPE_CHECKING:
    from radixlm.constrained.base import GrammarMatcher

_NEG_INF = float("-inf")


@dataclass(frozen=True)
class CpuMask:
    """A mask in a CPU layout: `ids` (int64, sorted) are exactly the allowed tokens, or else `additive`
    (float32 [n]) holds 0 for an allowed token and -inf for a blocked one; tokens >= n are blocked."""

    ids: torch.Tensor | None
    additive: torch.Tensor | None
    end: int  # ids: 1 + the largest id (0 when empty); additive: n. Says when a narrower row needs a cut
    ids_np: np.ndarray | None = None  # `ids` as numpy (the scratch path indexes with numpy: ~1 us an op
    #                                   where a torch op costs 2-4 us here)
    additive_np: np.ndarray | None = None  # `additive` as numpy (a view; see _add_row)


def allowed_list(ids: torch.Tensor) -> CpuMask:
    return CpuMask(ids, None, int(ids[-1]) + 1 if ids.numel() else 0, ids.numpy())


def additive_row(allowed_ids: torch.Tensor, size: int) -> CpuMask:
    row = torch.full((size,), _NEG_INF, dtype=torch.float32)
    row[allowed_ids] = 0.0
    return CpuMask(None, row, size, additive_np=row.numpy())


def num_words(width: int) -> int:
    return (width + 31) // 32


def pack_ids(ids: torch.Tensor, words: int) -> torch.Tensor:
    """int32 [words]: the bitmask with exactly the bits of `ids` (all < 32 * words) set."""
    bits = np.zeros(words * 32, dtype=np.uint8)
    bits[ids.numpy()] = 1
    return torch.from_numpy(_words_of(np.packbits(bits, bitorder="little")))


def pack_bool(mask: torch.Tensor) -> torch.Tensor:
    """bool [n] -> int32 [ceil(n / 32)] (bits past n are 0)."""
    bits = np.zeros(num_words(mask.shape[0]) * 32, dtype=np.uint8)
    bits[: mask.shape[0]] = mask.cpu().numpy()
    return torch.from_numpy(_words_of(np.packbits(bits, bitorder="little")))


def unpack_blocked(words: torch.Tensor, width: int) -> torch.Tensor:
    """int32 [R, >= ceil(width/32)] (CPU) -> bool [R, width], True where the token is NOT allowed."""
    raw = np.ascontiguousarray(np.invert(words.numpy()[:, : num_words(width)])).astype("<i4", copy=False)
    bits = np.unpackbits(raw.view(np.uint8), axis=-1, count=width, bitorder="little")
    return torch.from_numpy(bits).view(torch.bool)


def _words_of(packed_bytes: np.ndarray) -> np.ndarray:
    # Bytes in little-endian word order (bit j of word w = byte 4w + j // 8); the explicit "<i4" keeps
    # that true on any host, and the copy gives a writable, owned array.
    return packed_bytes.view("<i4").astype(np.int32)


def eos_only_bits(words: torch.Tensor, eos: int) -> None:
    """words := the bitmask allowing only `eos`."""
    words.zero_()
    bit = eos % 32
    words[eos // 32] = (1 << bit) - (1 << 32 if bit == 31 else 0)  # int32 two's complement


@dataclass
class GrammarMask:
    """The grammar masks of one sampling batch (B rows), built by MaskBuilder."""

    bitmask: torch.Tensor  # int32 [B, ceil(W/32)]; rows outside bit_rows hold all ones or stale words
    bit_rows: list[int]  # rows whose bitmask row holds their grammar's mask
    cpu: dict[int, CpuMask]  # rows whose mask is in a CPU layout instead (their bitmask row is unused)
    scratch: "LogitsScratch | None" = None  # the builder's reusable masked-logits buffer


class LogitsScratch:
    """The masked-logits buffer the CPU path writes into, reused across steps: an allowed-id-list row
    resets only the entries its previous step wrote (O(allowed tokens), no whole-row write); rows in
    other layouts are written whole and reset whole when a list comes next. CPU only."""

    _WHOLE = np.empty(0, dtype=np.int64)  # "the whole row was written"

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._width = 0
        self._written: list[np.ndarray | None] = []

    def rows(self, work: torch.Tensor) -> torch.Tensor:
        """The buffer, (re)allocated for work's shape and dtype: [>= B, W]; call before writing rows."""
        rows, width = work.shape
        buf = self._buf
        if buf is None or rows > len(self._written) or width != self._width or work.dtype != buf.dtype:
            buf = self._buf = torch.full((max(rows, 8), width), _NEG_INF, dtype=work.dtype)
            self._width = width
            self._rows_np = list(buf.numpy())  # row views sharing buf's memory
            self._written = [None] * buf.shape[0]
            self._views: dict[int, torch.Tensor] = {}
        return buf

    def put_list(self, i: int, source: np.ndarray, ids: np.ndarray) -> None:
        """Row i := -inf except source[ids] at ids."""
        row, old = self._rows_np[i], self._written[i]
        if old is self._WHOLE:
            row.fill(_NEG_INF)
        elif old is not None and old is not ids:  # the same list (same mask as last step) is overwritten
            row[old] = _NEG_INF
        row[ids] = source[ids]
        self._written[i] = ids

    def row(self, i: int) -> np.ndarray:
        """Row i of the buffer as numpy (a view)."""
        return self._rows_np[i]

    def mark_whole(self, i: int) -> None:
        self._written[i] = self._WHOLE

    def view(self, rows: int) -> torch.Tensor:
        view = self._views.get(rows)
        if view is None:
            view = self._views[rows] = self._buf[:rows]
        return view


class MaskBuilder:
    """Builds each step's GrammarMask into one reused buffer (no per-step allocation).

    On CUDA the buffer is pinned and the sampler copies it asynchronously; the sampler reads its sampled
    tokens back (a sync) before the next step refills the buffer, so the copy never sees a refill.
    """

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._pinned = False
        self._scratch = LogitsScratch()

    def build(self, matchers: Sequence[GrammarMatcher | None], width: int, device: torch.device,
              cpu_layouts: bool | None = None) -> GrammarMask | None:
        """Masks for a batch whose row i is constrained by matchers[i] (None: unconstrained), or None when
        no row is. cpu_layouts: use a matcher's CpuMask where it has one (CPU only; the default there)."""
        cpu = device.type == "cpu"
        cpu_layouts = cpu if cpu_layouts is None else cpu_layouts and cpu
        plans: dict[int, CpuMask] = {}
        bit_rows: list[int] = []
        if cpu_layouts and len(matchers) == 1:  # a lone request: the fewest calls (a step's caches are cold)
            plan = None if matchers[0] is None else matchers[0].cpu_mask()
            if plan is not None:
                return GrammarMask(_NO_WORDS, bit_rows, {0: plan}, self._scratch)
        for i, matcher in enumerate(matchers):
            if matcher is None:
                continue
            plan = matcher.cpu_mask() if cpu_layouts else None
            if plan is None:
                bit_rows.append(i)
            else:
                plans[i] = plan
        if not (plans or bit_rows):
            return None
        words = self._words(len(matchers), num_words(width), not cpu) if bit_rows else _NO_WORDS
        for i in bit_rows:
            matchers[i].fill_bitmask(words[i])
        if not cpu and len(bit_rows) < len(matchers):
            for i in set(range(len(matchers))) - set(bit_rows):
                words[i].fill_(-1)  # the kernel masks the whole batch: unconstrained rows allow all
        return GrammarMask(words, bit_rows, plans, self._scratch)

    def _words(self, rows: int, width: int, pin: bool) -> torch.Tensor:
        buf = self._buffer
        if buf is None or buf.shape[0] < rows or buf.shape[1] != width or self._pinned != pin:
            cap = max(rows, 2 * buf.shape[0] if buf is not None and buf.shape[1] == width else 8)
            buf = self._buffer = torch.empty(cap, width, dtype=torch.int32, pin_memory=pin)
            self._pinned = pin
        return buf[:rows]


_NO_WORDS = torch.empty(0, 0, dtype=torch.int32)


def greedy_under_grammar(source: torch.Tensor, greedy: Sequence[bool], mask: GrammarMask
                         ) -> tuple[dict[int, int], GrammarMask | None]:
    """The tokens of greedy rows that the grammar decides without masking their whole row, and the mask
    of the other rows (None when no row is left). source [B, W]: the sampler's logits after the other
    processors; greedy[i]: row i takes the argmax. CPU fp32 only (elsewhere: ({}, mask)).

    The same token as the argmax of the masked row, for less work (bench_grammar.py, "greedy" turns):
      * allowed-id list: the argmax of the allowed entries (ids are sorted, so the first maximum is the
        masked row's first maximum): a gather of ~10 values instead of a 49k-wide write and argmax;
      * additive row or bits: the argmax of the unmasked row, kept if the grammar allows it (then it is
        also the masked row's first maximum). llama.cpp's grammar sampler checks the top token first for
        the same reason. A refused token leaves the row to the full mask.
    Rows whose allowed entries are all -inf (dead) are left to the sampler, which gives them eos."""
    if not source.is_cpu or source.dtype != torch.float32:
        return {}, mask
    src = source.numpy()
    decided: dict[int, int] = {}
    for i, values, ids in _allowed_lists(src, greedy, mask):  # (numpy methods, not functions: a few us)
        k = values.argmax()
        if values[k] != _NEG_INF:  # NaN counts as a maximum, as in argmax_rows
            decided[i] = ids.item(k)
    check = [i for i, plan in mask.cpu.items() if greedy[i] and plan.ids_np is None]
    for i in check + [i for i in mask.bit_rows if greedy[i]]:
        row = src[i]
        token = int(row.argmax())
        if row[token] != _NEG_INF and _allows(mask, i, token):
            decided[i] = token
    return decided, without_rows(mask, decided)


def without_rows(mask: GrammarMask, done: dict[int, int]) -> GrammarMask | None:
    """The mask of the rows not in `done` (None when no constrained row is left)."""
    if not done:
        return mask
    cpu = {i: plan for i, plan in mask.cpu.items() if i not in done}
    bit_rows = [i for i in mask.bit_rows if i not in done]
    return GrammarMask(mask.bitmask, bit_rows, cpu, mask.scratch) if cpu or bit_rows else None


def select_allowed_lists(source: torch.Tensor, wanted: Sequence[bool], mask: GrammarMask
                         ) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(row, its allowed logits (a float32 copy), their ids) for each wanted row whose mask is a non-empty
    allowed-id list; CPU fp32 only (elsewhere: [])."""
    if not source.is_cpu or source.dtype != torch.float32:
        return []
    return _allowed_lists(source.numpy(), wanted, mask)


def _allowed_lists(src: np.ndarray, wanted: Sequence[bool], mask: GrammarMask
                   ) -> list[tuple[int, np.ndarray, np.ndarray]]:
    width = src.shape[-1]
    out = []
    for i, plan in mask.cpu.items():
        if wanted[i] and plan.ids_np is not None:
            ids = _ids_within(plan, width)
            if ids.size:
                out.append((i, src[i][ids], ids))
    return out


def _allows(mask: GrammarMask, row: int, token: int) -> bool:
    plan = mask.cpu.get(row)
    if plan is None:  # a bit row
        word = int(mask.bitmask.numpy()[row, token >> 5])  # int32: Python's >> keeps the sign bit right
        return bool((word >> (token & 31)) & 1)
    return token < plan.end and plan.additive_np[token] == 0.0  # (id-list rows never get here)


def apply_grammar_mask(work: torch.Tensor, processed: torch.Tensor | None, mask: GrammarMask) -> torch.Tensor:
    """-inf at every token the grammar blocks. work [B, W]: the sampler's logits (never written);
    processed: the sampler's private copy of them if it made one (edited in place). Returns the
    processed logits: `processed` or, without it, the builder's scratch buffer (a new tensor if the mask
    has none), which the caller must only read, and only until the next step."""
    if work.device.type != "cpu":
        return _apply_bits_device(work.clone() if processed is None else processed, mask)
    rows, width = work.shape
    if processed is None and mask.scratch is not None and work.dtype == torch.float32:
        return _apply_into_scratch(work, mask, mask.scratch)
    if processed is None:
        out = torch.empty_like(work, memory_format=torch.contiguous_format)
        for i in range(rows):
            plan = mask.cpu.get(i)
            if plan is None:
                out[i].copy_(work[i])  # unconstrained, or masked from its bitmask below
            elif plan.ids is not None:
                flat = _flat(plan, i, width)
                out[i].fill_(_NEG_INF)
                out.put_(flat, torch.take(work, flat))
            else:
                _add_row(out[i].numpy(), work[i].numpy(), plan, width)
    else:
        out = processed
        for i, plan in mask.cpu.items():
            if plan.ids is not None:
                flat = _flat(plan, i, width)
                values = torch.take(out, flat)
                out[i].fill_(_NEG_INF)
                out.put_(flat, values)
            else:
                _add_row(out[i].numpy(), out[i].numpy(), plan, width)
    _apply_bits_cpu(out, mask, width)
    return out


def _apply_into_scratch(work: torch.Tensor, mask: GrammarMask, scratch: LogitsScratch) -> torch.Tensor:
    """The CPU path without a processed copy: every row written into the reused scratch buffer."""
    rows, width = work.shape
    scratch.rows(work)  # (re)allocated for this shape
    source = work.numpy()  # a view (float32 CPU); numpy indexing costs ~1 us where a torch op costs 2-4
    for i in range(rows):
        plan = mask.cpu.get(i)
        if plan is not None and plan.ids_np is not None:
            ids = _ids_within(plan, width)
            scratch.put_list(i, source[i], ids)
            continue
        row = scratch.row(i)
        if plan is None:
            np.copyto(row, source[i])  # unconstrained, or masked from its bitmask below
        else:
            _add_row(row, source[i], plan, width)
        scratch.mark_whole(i)
    out = scratch.view(rows)
    _apply_bits_cpu(out, mask, width)
    return out


def _apply_bits_cpu(out: torch.Tensor, mask: GrammarMask, width: int) -> None:
    if mask.bit_rows:
        blocked = unpack_blocked(mask.bitmask[mask.bit_rows], width)
        for k, i in enumerate(mask.bit_rows):
            out[i].masked_fill_(blocked[k], _NEG_INF)


def _ids_within(plan: CpuMask, width: int) -> np.ndarray:
    """The plan's allowed ids (numpy) below `width` (a narrower logits row cuts the mask)."""
    return plan.ids_np if plan.end <= width else plan.ids_np[plan.ids_np < width]


def _flat(plan: CpuMask, row: int, width: int) -> torch.Tensor:
    """The plan's allowed ids as flat indices into row `row` of a [B, width] tensor."""
    ids = plan.ids if plan.end <= width else plan.ids[plan.ids < width]
    return ids + row * width if row else ids


def _add_row(dst: np.ndarray, src: np.ndarray, plan: CpuMask, width: int) -> None:
    """dst := src + the additive row (-inf where blocked); columns past the row are blocked. On numpy
    views: numpy's add of a 49k row measured 10 vs 12 us hot, 40 vs 73 us with cold caches (torch.add)."""
    n = min(width, plan.end)
    np.add(src[:n], plan.additive_np[:n], out=dst[:n])
    dst[n:] = _NEG_INF


def _apply_bits_device(out: torch.Tensor, mask: GrammarMask) -> torch.Tensor:
    from radixlm.kernels._triton import HAS_TRITON
    from radixlm.kernels.grammar_mask import apply_grammar_bitmask_, unpack_bitmask

    width = out.shape[-1]
    bits = mask.bitmask[:, : num_words(width)].to(out.device, non_blocking=True)
    if HAS_TRITON:
        apply_grammar_bitmask_(out, bits)
    else:
        out.masked_fill_(~unpack_bitmask(bits, width), _NEG_INF)
    return out
