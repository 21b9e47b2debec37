"""N-gram proposals (prompt lookup): continue the longest suffix of a sequence that occurred before.

Runs in the scheduler process. Two sources, longest match first:
  - NgramIndex: the request's own tokens (prompt + output), indexed incrementally (each new token adds
    one entry per n-gram length), so a lookup is a few dict probes, never a scan of the sequence;
  - NgramCorpus: every sequence the scheduler has put into the radix cache (finished requests' prompt +
    output), per namespace, so a request can continue text another request produced (few-shot examples,
    a JSON layout, a previous answer). A tenant's text is never proposed to another tenant.
Proposals are only guesses: verification keeps exactly what the target model would have produced.
"""

from __future__ import annotations

from collections import OrderedDict


class NgramIndex:
    """Suffix lookup over one growing token sequence. For each n in [min_n, max_n] and each n-gram that
    occurred (ending before the sequence's last token), the position right after its latest occurrence."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self._indexed = 0  # n-grams ending at positions < _indexed are in the maps

    def _update(self, seq: list[int]) -> None:
        # The n-gram ending at the last position is the suffix being looked up: index up to len - 1.
        for end in range(max(self._indexed, self.min_n), len(seq)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._ends[n][tuple(seq[end - n : end])] = end
        self._indexed = max(self._indexed, len(seq))

    def lookup(self, seq: list[int], n: int) -> int | None:
        """Where the latest earlier occurrence of seq's last n tokens continues, or None."""
        self._update(seq)
        if n > len(seq):
            return None
        return self._ends[n].get(tuple(seq[-n:]))


class NgramCorpus:
    """Continuations of n-grams seen in cached sequences, per namespace, bounded (oldest dropped first)."""

    def __init__(self, min_n: int, max_n: int, k: int, max_entries: int = 1 << 18):
        self.min_n, self.max_n, self.k = min_n, max_n, k
        self.max_entries = max_entries
        self._maps: dict[str, OrderedDict[tuple[int, ...], tuple[int, ...]]] = {}
        self._size = 0

    def add(self, namespace: str, seq: list[int]) -> None:
        table = self._maps.setdefault(namespace, OrderedDict())
        for end in range(self.min_n, len(seq)):
            cont = tuple(seq[end : end + self.k])
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(seq[end - n : end])
                if key in table:
                    table.move_to_end(key)
                else:
                    self._size += 1
                table[key] = cont
        while self._size > self.max_entries:
            largest = max(self._maps.values(), key=len)
            largest.popitem(last=False)
            self._size -= 1

    def lookup(self, namespace: str, seq: list[int], n: int) -> tuple[int, ...] | None:
        table = self._maps.get(namespace)
        if table is None or n > len(seq):
            return None
        return table.get(tuple(seq[-n:]))

    def clear(self) -> None:
        self._maps.clear()
        self._size = 0


def propose_ngram(seq: list[int], own: NgramIndex, corpus: NgramCorpus | None, namespace: str, k: int
                  ) -> tuple[list[int], int]:
    """(up to k tokens continuing seq, the length of the suffix matched): the longest suffix match, own
    tokens first at equal length; ([], 0) without a match."""
    for n in range(own.max_n, own.min_n - 1, -1):
        end = own.lookup(seq, n)
        if end is not None:
            cont = seq[end : end + k]
            if cont:
                return cont, n
        if corpus is not None:
            found = corpus.lookup(namespace, seq, n)
            if found:
                return list(found[:k]), n
    return [], 0
