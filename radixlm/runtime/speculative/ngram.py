"""N-gram proposals (prompt lookup): continue the longest suffix of a sequence that occurred before.

Runs in the scheduler process. Three sources, longest match first (at equal length in this order):
  - NgramIndex: the request's own tokens (prompt + output), indexed incrementally (each new token
    adds one entry per n-gram length; a prompt that begins as another running request's does starts
    from a copy of its index, adopt), so a lookup is a few dict probes and a scan of the few tokens
    added since the last observe (tuning.tail_scan_max), never a scan of the sequence;
  - LiveNgrams: the tokens of the other requests running now in the same namespace (their prompts,
    e.g. a few-shot prefix shared by a batch, and what they have generated so far). Each request's
    NgramIndex writes its new n-grams here as it grows (no second pass over the tokens), and a
    request's entries leave when it does, so this table is bounded by the running requests' tokens
    (the KV pool);
  - NgramCorpus: every sequence the scheduler has put into the radix cache (finished requests'
    prompt + output), per namespace, so a request can continue text another request produced
    (few-shot examples, a JSON layout, a previous answer); bounded, the least recently seen n-grams
    evicted first.
A tenant's text is never proposed to another tenant (both shared tables are per namespace).
Proposals are only guesses: verification keeps exactly what the target model would have produced.

A request copying from its own text keeps cursors: the positions right after the source tokens its
last accepted drafts came from. Of a suffix's occurrences, the first at or after a cursor (within
tuning.cursor_window tokens) is proposed rather than the latest: a JSON answer copies keys from a
few-shot example and values from a record, each in order, and the latest occurrence of '", "' is the
answer's own previous field. A lookup reads the tables, which hold what the last observe() indexed
(the scheduler calls it after each launch, where a GPU hides its time), and scans the few tokens
added since (a step's accepted tokens) for the suffix instead of indexing them first: on a GPU the
proposal runs while the device waits.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from radixlm.runtime.speculative.tuning import TUNING as T


@dataclass(frozen=True, slots=True)
class Proposal:
    tokens: list[int]
    match: int  # length of the suffix matched (0: no proposal)
    source: int | None = None  # where tokens start in the request's own sequence (None: another source)
    shared: tuple[list[int], int] | None = None  # another running request's tokens, where the draft starts


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens a and b share, at most limit (slice comparisons, halving the step)."""
    if a[:limit] == b[:limit]:  # a prompt that repeats or continues another's whole text: one comparison
        return limit
    lo, step = 0, max(1, limit)
    while step:
        hi = min(limit, lo + step)
        if hi > lo and a[lo:hi] == b[lo:hi]:
            lo = hi
        else:
            step //= 2
        if lo == limit:
            break
    return lo


def nearest_after(ends: Sequence[int], spans: Sequence[tuple[int, int]]) -> int | None:
    """Of the sorted positions ends, the one closest after (or at) the start of any span (lo, hi), and not
    past its hi; None when no span holds one."""
    best = None
    for lo, hi in spans:
        i = bisect_left(ends, lo)
        if i < len(ends) and ends[i] <= hi and (best is None or ends[i] - lo < best[0]):
            best = (ends[i] - lo, ends[i])
    return None if best is None else best[1]


class NgramIndex:
    """Suffix lookup over one growing token sequence. For each n in [min_n, max_n] and each n-gram that
    occurred (ending before the sequence's last token), the positions right after its occurrences."""

    def __init__(self, min_n: int, max_n: int, shared: dict | None = None, shared_min_n: int = 1):
        self.min_n, self.max_n = min_n, max_n
        self.shared_min_n = shared_min_n  # shorter n-grams stay private (a weak match: own text only)
        self._ends: dict[int, dict[tuple[int, ...], int | list[int]]] = {n: {} for n in range(min_n, max_n + 1)}
        self._indexed = 0  # n-grams ending at positions < _indexed are in the maps
        self.tokens: list[int] = []  # the sequence last indexed (other requests read continuations here)
        self.shared = shared  # LiveNgrams' namespace table: n-gram -> (owner index, end)
        # Whether the sequence only ever grows: _update indexes new positions only, so where tokens were
        # replaced (a grammar's jump-forward re-tokenizes them) the tables still hold the old ones, and such
        # an index is nobody's donor (adopt).
        self.append_only = True
        # Once it has adopted or been adopted from, the lists (an n-gram's ends, from its second occurrence)
        # this index made since and alone holds: appended in place, any other is shared with a donor or an
        # adopter and copied before it grows (adopt). None: every list is its own.
        self._owned: set[int] | None = None

    def _update(self, seq: list[int]) -> None:
        # The n-gram ending at the last position is the suffix being looked up: index up to len - 1. Each
        # position's n-grams are slices of one tuple of its longest, with one dict probe per n-gram and one
        # shared entry per position: this runs for every running request every step.
        self.tokens = seq
        shared, lo, hi, shared_lo, owned = self.shared, self.min_n, self.max_n, self.shared_min_n, self._owned
        tables = [(n, self._ends[n]) for n in range(lo, hi + 1)]
        for end in range(max(self._indexed, lo), len(seq)):
            top = min(hi, end)
            window = tuple(seq[end - top : end])
            entry = (self, end)
            for n, table in tables[: top - lo + 1]:
                key = window[top - n :]
                ends = table.setdefault(key, end)  # most n-grams occur once: an int, a list from the second
                if ends != end:  # it occurred before (no earlier entry can hold this end)
                    if ends.__class__ is int:
                        ends = table[key] = [ends, end]
                        if owned is not None:
                            owned.add(id(ends))
                    elif owned is None or id(ends) in owned:
                        ends.append(end)
                    else:  # shared with a donor or an adopter (adopt): a copy of its own
                        ends = table[key] = ends + [end]
                        owned.add(id(ends))
                if shared is not None and n >= shared_lo:
                    shared[key] = entry
        self._indexed = max(self._indexed, len(seq))

    @property
    def indexed(self) -> int:
        """The n-grams ending before this position are in the tables."""
        return self._indexed

    def observe(self, seq: list[int]) -> None:
        """Index seq's new tokens (so other running requests see them) without a lookup."""
        self._update(seq)

    def adopt(self, donor: NgramIndex, seq: list[int]) -> int:
        """Start this (empty) index from donor's tables where they describe seq too: every n-gram that ends
        within the tokens seq shares with donor.tokens (a batch's common system prompt or few-shot prefix;
        a retried or continued conversation). The result, and the live table's entries, are what indexing
        seq's first tokens one by one gives (tests compare them): a copy of each table (its lists shared,
        which neither index then changes in place), less the ends past the common prefix, and this index
        written into the live table as the latest writer of each n-gram it now holds. Returns the positions
        taken."""
        assert not self._indexed and donor.append_only and (donor.min_n, donor.max_n) == (self.min_n, self.max_n)
        limit = min(len(seq), donor._indexed)
        same = common_prefix(seq, donor.tokens, limit)
        upto = min(same + 1, limit)  # ends e <= same: the n-gram before e lies within the common tokens
        if upto <= self.min_n:
            return 0
        tokens, entries = donor.tokens, [(self, end) for end in range(upto)]
        donor._owned, self._owned = set(), set()  # their lists are both indexes' from here on
        for n, table in donor._ends.items():
            mine = self._ends[n] = dict(table)
            self._drop_ends_past(mine, tokens, n, upto, donor._indexed)
            if self.shared is not None and n >= self.shared_min_n:
                self.shared.update({key: entries[ends if ends.__class__ is int else ends[-1]]
                                    for key, ends in mine.items()})
        self._indexed = upto
        self.tokens = seq
        return upto

    def _drop_ends_past(self, mine: dict, tokens: list[int], n: int, upto: int, indexed: int) -> None:
        """Take the n-grams of tokens[upto:indexed] (a donor's own text past the common prefix) back out of
        mine, the copy of the donor's n-table: their ends at upto or later go."""
        for end in range(max(upto, n), indexed):
            key = tuple(tokens[end - n : end])
            ends = mine.get(key)
            if ends is None:
                continue
            kept = [e for e in ((ends,) if ends.__class__ is int else ends) if e < upto]
            if not kept:
                del mine[key]
            elif len(kept) == 1:
                mine[key] = kept[0]
            else:
                mine[key] = kept
                self._owned.add(id(kept))  # a list of this index's own

    def occurrences(self, seq: list[int], n: int) -> Sequence[int]:
        """The positions right after each earlier occurrence of seq's last n tokens (one ending before
        seq's last token), ascending: the indexed ones, then those in the tail not indexed yet. Read only:
        without a match in the tail it is the table's own list (a common token's runs to hundreds)."""
        if len(seq) - self._indexed > T.tail_scan_max:
            self._update(seq)
        if not self.min_n <= n <= self.max_n or n > len(seq):
            return ()
        key = tuple(seq[-n:])
        found = self._ends[n].get(key)
        ends = () if found is None else (found,) if found.__class__ is int else found
        last = seq[-1]
        tail = [end for end in range(max(self._indexed, n), len(seq))
                if seq[end - 1] == last and tuple(seq[end - n : end]) == key]
        return [*ends, *tail] if tail else ends

    def keys(self, min_n: int = 1):
        """The n-grams indexed, for every n >= min_n."""
        for n, table in self._ends.items():
            if n >= min_n:
                yield from table

    def lookup(self, seq: list[int], n: int, cursors: Sequence[int] = ()) -> int | None:
        """Where an earlier occurrence of seq's last n tokens continues (the first after a cursor, else the
        latest), or None."""
        ends = self.occurrences(seq, n)
        if not ends:
            return None
        spans = [(c, c + T.cursor_window) for c in cursors]
        return (nearest_after(ends, spans) if spans else None) or ends[-1]

    def agreed(self, seq: list[int], draft: Sequence[int], source: int, n: int) -> int:
        """How many of draft's tokens (the continuation at position source of seq) every other earlier
        occurrence of seq's last n tokens continues with too, as far as it goes."""
        keep = len(draft)
        for end in self.occurrences(seq, n):
            if end == source:
                continue
            same = 0
            for a, b in zip(draft[:keep], seq[end : end + keep]):
                if a != b:
                    keep = same
                    break
                same += 1
        return keep


class LiveNgrams:
    """The n-grams of the running requests, per namespace: n-gram -> (the NgramIndex of the request that
    wrote it last, the position after it). Entries are written by NgramIndex._update and dropped when their
    request leaves (its text then goes to the NgramCorpus if it finished normally)."""

    def __init__(self) -> None:
        self._maps: dict[str, dict[tuple[int, ...], tuple[NgramIndex, int]]] = {}
        self._users: dict[str, int] = {}  # indexes writing into each namespace's table

    def table(self, namespace: str) -> dict:
        """The namespace's table, for one new NgramIndex to write into (it must be remove()d later)."""
        self._users[namespace] = self._users.get(namespace, 0) + 1
        return self._maps.setdefault(namespace, {})

    def lookup(self, namespace: str, seq: list[int], n: int, k: int, asker: NgramIndex) -> list[int]:
        """Up to k tokens continuing seq's last n tokens in another running request's text ([] if none)."""
        found = self.find(namespace, seq, n, asker)
        return [] if found is None else found[0][found[1] : found[1] + k]

    def find(self, namespace: str, seq: list[int], n: int, asker: NgramIndex) -> tuple[list[int], int] | None:
        """(another running request's tokens, the position after its occurrence of seq's last n tokens)."""
        table = self._maps.get(namespace)
        if table is None or n > len(seq):
            return None
        found = table.get(tuple(seq[-n:]))
        if found is None or found[0] is asker:
            return None
        owner, end = found
        return owner.tokens, end

    def has(self, namespace: str, key: tuple[int, ...]) -> bool:
        """Whether any running request of the namespace wrote this n-gram (the asker included)."""
        table = self._maps.get(namespace)
        return table is not None and key in table

    def remove(self, namespace: str, index: NgramIndex) -> None:
        table = self._maps.get(namespace)
        if table is None:
            return
        for key in index.keys(index.shared_min_n):  # shorter ones were never written here
            found = table.get(key)
            if found is not None and found[0] is index:
                del table[key]
        self._users[namespace] -= 1
        if not self._users[namespace]:  # no running request of this tenant: drop its (empty) table
            del self._maps[namespace], self._users[namespace]

    def __len__(self) -> int:
        return len(self._maps)


class NgramCorpus:
    """Continuations of n-grams seen in cached sequences, per namespace, bounded (oldest dropped first)."""

    def __init__(self, min_n: int, max_n: int, k: int, max_entries: int = 1 << 18):
        self.min_n, self.max_n, self.k = min_n, max_n, k
        self.max_entries = max_entries
        self._maps: dict[str, OrderedDict[tuple[int, ...], tuple[int, ...]]] = {}
        self._size = 0

    def add(self, namespace: str, seq: list[int]) -> None:
        table = self._maps.setdefault(namespace, OrderedDict())
        lo, hi, k = self.min_n, self.max_n, self.k
        before, latest = len(table), table.move_to_end
        for end in range(lo, len(seq)):
            cont = tuple(seq[end : end + k])
            top = min(hi, end)
            window = tuple(seq[end - top : end])  # each n-gram a slice of it (NgramIndex._update)
            for n in range(lo, top + 1):
                key = window[top - n :]
                table[key] = cont  # a new key goes last; a known one keeps its place until moved there
                latest(key)
        self._size += len(table) - before
        while self._size > self.max_entries:
            largest = max(self._maps.values(), key=len)
            largest.popitem(last=False)
            self._size -= 1

    def has(self, namespace: str, key: tuple[int, ...]) -> bool:
        table = self._maps.get(namespace)
        return table is not None and key in table

    def lookup(self, namespace: str, seq: list[int], n: int) -> tuple[int, ...] | None:
        table = self._maps.get(namespace)
        if table is None or n > len(seq):
            return None
        return table.get(tuple(seq[-n:]))

    def clear(self) -> None:
        self._maps.clear()
        self._size = 0


def propose_ngram(seq: list[int], own: NgramIndex, corpus: NgramCorpus | None, namespace: str, k: int,
                  live: LiveNgrams | None = None, min_n: int | None = None, cursors: Sequence[int] = ()
                  ) -> Proposal:
    """Up to k tokens continuing seq: the longest suffix match of at least min_n tokens (default
    own.min_n); at equal length own tokens first (the occurrence after a cursor first), then other
    running requests', then the corpus (those two only for n >= own.shared_min_n); empty without a match."""
    lo = max(own.min_n, min_n or 0)
    if lo < own.max_n and not _occurs(seq, lo, own, corpus, namespace, live):
        return Proposal([], 0)
    for n in range(own.max_n, lo - 1, -1):
        end = own.lookup(seq, n, cursors)
        if end is not None:
            cont = seq[end : end + k]
            if cont:
                return Proposal(cont, n, end)
        if n < own.shared_min_n:
            continue
        if live is not None:
            found = live.find(namespace, seq, n, own)
            if found is not None and found[1] < len(found[0]):
                tokens, end = found
                return Proposal(tokens[end : end + k], n, None, found)
        if corpus is not None:
            found = corpus.lookup(namespace, seq, n)
            if found:
                return Proposal(list(found[:k]), n)
    return Proposal([], 0)


def _occurs(seq: list[int], lo: int, own: NgramIndex, corpus: NgramCorpus | None, namespace: str,
            live: LiveNgrams | None) -> bool:
    """Whether seq's shortest wanted suffix is in any source. Every table holds each entry's shorter
    n-grams too (down to its own least n), so without it no longer match exists either, and free text (no
    match at all, most steps) costs one probe per source instead of one per length."""
    if lo > len(seq):
        return False
    if own.occurrences(seq, lo):
        return True
    n = max(lo, own.shared_min_n)
    if live is not None and n <= len(seq) and live.has(namespace, tuple(seq[-n:])):
        return True
    if corpus is None:
        return False
    n = max(n, corpus.min_n)
    return n <= len(seq) and corpus.has(namespace, tuple(seq[-n:]))
