"""CUDA graphs for decode steps: capture the model forward once per batch-size bucket, then replay.

Runs inside the scheduler process, on CUDA with the Triton attention backend (its decode path never
synchronises with the host and its scratch buffers come from the caching allocator, so it can be
captured). A decode step of n requests replays the graph of the smallest bucket >= n: the step's inputs
are copied into static buffers, rows n..bucket-1 are padding (seq_len 0, so decode attention writes
zeros for them; their K/V go to the scratch slot 0), and the logits of the first n rows are returned.
This removes the per-kernel launch cost that dominates small-batch decode on a GPU (SGLang's
CudaGraphRunner does the same).

The graph class is injectable so that tests can replay the same static-buffer path eagerly on CPU
(`EagerGraph`); only the capture itself needs a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from radixlm.runtime.forward import AttentionMetadata

logger = logging.getLogger(__name__)


def default_buckets(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, then every 16 (SGLang's spacing), ending at max_bs."""
    sizes = [1, 2, 4] + list(range(8, 65, 8)) + list(range(80, max(max_bs, 80) + 1, 16))
    return sorted({s for s in sizes if s < max_bs} | {max_bs})


class GraphLike(Protocol):
    pool: object  # memory pool handle after capture, passed to the next graph of the same runner

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Record fn (run on the static buffers); return the static output it writes."""
        ...

    def replay(self) -> None:
        ...


class CudaGraph:
    """torch.cuda.CUDAGraph; the graphs of one runner share one memory pool (captured largest first).

    The pool is per runner, never global: graphs sharing a pool may overwrite each other's intermediates
    and outputs, which is safe only when they are replayed one at a time and each output is consumed
    before the next replay, as one scheduler does (two engines in one process would not)."""

    def __init__(self, pool: object = None) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: Triton compiles and the allocator settles outside capture
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = fn()
        self.pool = self.graph.pool()
        return out

    def replay(self) -> None:
        self.graph.replay()


class EagerGraph:
    """Replays by calling the function again on the static buffers: the same data path, no capture."""

    def __init__(self, pool: object = None) -> None:
        self.pool = pool

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        with torch.inference_mode():  # the output is an inference tensor (the model runs in that mode)
            self.out.copy_(self.fn())


def capture_buckets(buckets: list[int], graph_cls: type, step_for: Callable[[int], Callable[[], torch.Tensor]]
                    ) -> tuple[dict[int, GraphLike], dict[int, torch.Tensor]]:
    """Capture step_for(bs) per bucket, largest first, into one memory pool (smaller graphs reuse the
    largest's memory); the graphs and their static outputs by batch size."""
    graphs: dict[int, GraphLike] = {}
    outputs: dict[int, torch.Tensor] = {}
    pool = None
    for bs in reversed(buckets):
        graph = graph_cls(pool)
        outputs[bs] = graph.capture(step_for(bs))
        graphs[bs] = graph
        pool = graph.pool
    return graphs, outputs


@dataclass
class _Static:
    inputs: torch.Tensor  # int64 [5, max_bs]: the rows below, filled by one copy per replay
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    logits_indices: torch.Tensor

    @classmethod
    def zeros(cls, max_bs: int, device: torch.device) -> "_Static":
        inputs = torch.zeros(5, max_bs, dtype=torch.int64, device=device)
        return cls(inputs, *inputs.unbind(0), torch.arange(max_bs, device=device))


class DecodeGraphRunner:
    def __init__(self, forward: Callable[..., torch.Tensor], req_to_token: torch.Tensor, sm_scale: float,
                 max_bs: int, device: torch.device, graph_cls: type = CudaGraph):
        """forward(input_ids, positions, meta, logits_indices) -> logits: the model with its backend and pool."""
        self.buckets = default_buckets(max_bs)
        self.max_bs = max_bs
        self.static = s = _Static.zeros(max_bs, device)

        def step_for(bs: int) -> Callable[[], torch.Tensor]:
            meta = self._meta(bs, req_to_token, sm_scale)
            return lambda: forward(s.input_ids[:bs], s.positions[:bs], meta, s.logits_indices[:bs])

        self.graphs, self.outputs = capture_buckets(self.buckets, graph_cls, step_for)
        logger.info("captured decode graphs for batch sizes %s", self.buckets)

    def _meta(self, bs: int, req_to_token: torch.Tensor, sm_scale: float) -> AttentionMetadata:
        s = self.static
        ones = torch.ones(bs, dtype=torch.int64, device=s.seq_lens.device)
        # The host lists are placeholders: the Triton decode path reads only the device tensors.
        return AttentionMetadata(
            req_to_token=req_to_token, req_pool_indices=s.req_pool_indices[:bs], seq_lens=s.seq_lens[:bs],
            prefix_lens=s.seq_lens[:bs], extend_lens=ones, extend_start_loc=s.logits_indices[:bs],
            out_cache_loc=s.out_cache_loc[:bs], is_decode=True, sm_scale=sm_scale,
            seq_lens_list=[], prefix_lens_list=[], extend_lens_list=[1] * bs,
            extend_start_loc_list=list(range(bs)))

    def can_run(self, meta: AttentionMetadata, input_ids: torch.Tensor, logits_indices: torch.Tensor) -> bool:
        """A pure decode step of at most max_bs requests whose logits are exactly its rows, in order.
        The indices are checked only as a host tensor (the scheduler's plan): reading a device tensor here
        would synchronise every step."""
        n = int(input_ids.numel())
        return (meta.is_decode and 0 < n <= self.max_bs and logits_indices.numel() == n
                and logits_indices.device.type == "cpu" and bool(torch.equal(logits_indices, torch.arange(n))))

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        n = int(input_ids.numel())
        bs = next(b for b in self.buckets if b >= n)
        s = self.static
        # One stack and one copy instead of five copies (launch overhead is what graphs are here to cut).
        s.inputs[:, :n].copy_(torch.stack([input_ids, positions, meta.req_pool_indices, meta.seq_lens,
                                           meta.out_cache_loc]))
        if bs > n:  # padding rows: no KV to read, K/V written to the scratch slot 0
            s.inputs[:, n:bs].zero_()
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
