"""TokenLogprobs: the prompt logprobs kept beside a radix node's KV, so that a cached prefix answers a request
for prompt logprobs (an eval harness's echo + logprobs) without recomputing it. Scheduler process.

Entry i belongs to the i-th token of a run: the logprob of that token given every token before it on the tree
path (computed from the logits one position earlier), and the top-k alternatives at that position. A node's
entries are therefore valid only for its own path, which is exactly what a radix tree guarantees. An entry
is unknown (value NaN) until some request actually computed it; the path's first token never has one.
Memory: 4 + 8k bytes a token (k = the kept top-k, float32 values and int32 ids), against tens of kilobytes
of KV a token, and only on nodes where logprobs were computed (None elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenLogprobs:
    values: torch.Tensor  # float32 [n]: logprob of each token given its path; NaN = unknown
    top_values: torch.Tensor  # float32 [n, k]: the top-k logprobs at the position, descending
    top_ids: torch.Tensor  # int32 [n, k]: their token ids

    @classmethod
    def unknown(cls, n: int, k: int) -> TokenLogprobs:
        return cls(torch.full((n,), float("nan")), torch.zeros(n, k), torch.zeros(n, k, dtype=torch.int32))

    @classmethod
    def cat(cls, parts: list[TokenLogprobs]) -> TokenLogprobs:
        return cls(torch.cat([p.values for p in parts]), torch.cat([p.top_values for p in parts]),
                   torch.cat([p.top_ids for p in parts]))

    def __len__(self) -> int:
        return int(self.values.numel())

    @property
    def top_k(self) -> int:
        return int(self.top_ids.shape[1])

    def known(self) -> torch.Tensor:
        return ~torch.isnan(self.values)

    def slice(self, lo: int, hi: int) -> TokenLogprobs:
        """Entries [lo, hi) as a copy (a node never shares storage with a request or another node)."""
        return TokenLogprobs(self.values[lo:hi].clone(), self.top_values[lo:hi].clone(), self.top_ids[lo:hi].clone())

    def window(self, n: int) -> TokenLogprobs:
        """The first n entries, unknown past the end (a request's sequence outgrows its prompt's entries)."""
        if n <= len(self):
            return self.slice(0, n)
        return TokenLogprobs.cat([self.slice(0, len(self)), TokenLogprobs.unknown(n - len(self), self.top_k)])

    def put(self, start: int, values: torch.Tensor, top_values: torch.Tensor, top_ids: torch.Tensor) -> None:
        """Record computed entries for positions [start, start + len(values)) (top-k columns beyond ours cut)."""
        end = start + int(values.numel())
        k = self.top_k
        self.values[start:end] = values.to(torch.float32).cpu()
        self.top_values[start:end] = top_values[:, :k].to(torch.float32).cpu()
        self.top_ids[start:end] = top_ids[:, :k].to(torch.int32).cpu()

    def fill_unknown(self, other: TokenLogprobs) -> None:
        """Take other's known entries where ours are unknown (same positions, same path); known ones stay."""
        take = torch.isnan(self.values) & other.known()
        if bool(take.any()):
            self.values[take] = other.values[take]
            self.top_values[take] = other.top_values[take]
            self.top_ids[take] = other.top_ids[take]


def known_or_none(logprobs: TokenLogprobs | None) -> TokenLogprobs | None:
    """What a node keeps: None when nothing is known (no memory for the common, logprob-free traffic)."""
    if logprobs is None or not bool(logprobs.known().any()):
        return None
    return logprobs


@dataclass(frozen=True)
class CachedLogprobs:
    """RadixCache.cached_logprobs' answer: reuse the KV of tokens [0, length); the logprobs of tokens
    (start, length] come from the tree (`logprobs`, entry j for token start + 1 + j)."""

    length: int
    logprobs: TokenLogprobs
