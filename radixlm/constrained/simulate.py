"""Drive a matcher without a model: a seeded random-logit policy over the tokenizer's vocabulary.

Runs in tests and benchmarks (any process). Each step samples a uniformly random allowed token (the
argmax of random logits under the mask); past `soft_len` tokens it steers to the nearest accepting
state (shortest byte path in the grammar's DFA; a closers-first heuristic for backends without one)
and then takes EOS, so unbounded strings still end.
With jump_forward on, forced strings are appended through apply_jump_forward as the engine would.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from radixlm.constrained.base import GrammarMatcher
from radixlm.constrained.fsm import TokenFSM
from radixlm.constrained.jump_forward import apply_jump_forward
from radixlm.constrained.outlines_backend import OutlinesMatcher
from radixlm.constrained.vocabulary import FAKE_BYTE_BASE, token_bytes_for


@dataclass
class WalkResult:
    token_ids: list[int]
    text: str
    num_steps: int            # sampled tokens (one decode step each)
    num_jumps: int = 0
    num_jump_tokens: int = 0  # tokens appended by jump-forward (no decode step)
    finished: bool = False    # ended with EOS / terminated inside max_tokens
    mask_seconds: list[float] = field(default_factory=list)


def shortest_completion(fsm: TokenFSM, state: int, limit: int = 100_000) -> bytes | None:
    """Shortest byte string from state to an accepting state (BFS over the byte-level DFA)."""
    parents: dict[int, tuple[int, int] | None] = {state: None}
    queue = deque([state])
    while queue and len(parents) < limit:
        cur = queue.popleft()
        if fsm.info(cur).accepting:
            out = []
            while parents[cur] is not None:
                cur, b = parents[cur]
                out.append(b)
            return bytes(reversed(out))
        for b in fsm.info(cur).next_bytes:
            nxt = fsm.index.get_next_state(cur, FAKE_BYTE_BASE + b)
            if nxt is not None and nxt not in parents:
                parents[nxt] = (cur, b)
                queue.append(nxt)
    return None


# For matchers without a DFA to search (xgrammar): closers first, then short scalar material.
_CLOSERS = b'"}],0123456789aeEtrufnl'


def _steer_token(matcher: GrammarMatcher, allowed: list[int], byte_ids: dict[int, int]) -> int | None:
    if isinstance(matcher, OutlinesMatcher):
        path = shortest_completion(matcher.fsm, matcher.state)
        return byte_ids.get(path[0]) if path else None
    allowed_set = set(allowed)
    for t in allowed[:256]:  # a token that completes the text right away
        probe = matcher.copy()
        if probe.accept_token(t) and probe.is_accepting():
            return t
    for b in _CLOSERS:
        if byte_ids.get(b) in allowed_set:
            return byte_ids[b]
    return None


def random_walk(matcher: GrammarMatcher, tokenizer: Any, vocab_size: int, seed: int,
                max_tokens: int = 400, soft_len: int = 48, jump_forward: bool = True,
                time_masks: bool = False, on_step: Callable[[GrammarMatcher], None] | None = None
                ) -> WalkResult:
    """on_step(matcher) runs before each step's mask (benchmarks time other mask paths there)."""
    import time

    table = token_bytes_for(tokenizer)
    byte_ids = {b[0]: i for i, b in enumerate(table.token_bytes) if b is not None and len(b) == 1}
    rng = random.Random(seed)
    eos = table.eos_token_id
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    res = WalkResult([], "", 0)
    while len(res.token_ids) < max_tokens and not matcher.is_terminated():
        if on_step is not None:
            on_step(matcher)
        t0 = time.perf_counter()
        matcher.fill_allowed_mask(mask)
        if time_masks:
            res.mask_seconds.append(time.perf_counter() - t0)
        allowed = mask.nonzero().flatten().tolist()
        if not allowed:
            raise AssertionError(f"empty mask after {table.bytes_of(res.token_ids)!r}")
        res.num_steps += 1
        token = _choose(matcher, allowed, eos, len(res.token_ids) >= soft_len, rng, byte_ids)
        if not matcher.accept_token(token):
            raise AssertionError(f"matcher refused allowed token {token}")
        res.token_ids.append(token)
        if jump_forward and token != eos:
            jumped = apply_jump_forward(matcher, tokenizer, res.token_ids)
            if jumped is not None:
                drop, new = jumped
                res.token_ids[len(res.token_ids) - drop:] = new
                res.num_jumps += 1
                res.num_jump_tokens += len(new)
    res.finished = matcher.is_terminated()
    body = [t for t in res.token_ids if t != eos]
    res.text = (table.bytes_of(body) or b"").decode("utf-8", errors="strict")
    return res


def _choose(matcher: GrammarMatcher, allowed: list[int], eos: int, late: bool, rng: random.Random,
            byte_ids: dict[int, int]) -> int:
    if eos in allowed and (late or rng.random() < 0.1 or allowed == [eos]):
        return eos
    if late:
        steer = _steer_token(matcher, allowed, byte_ids)
        if steer is not None and steer in allowed:
            return steer
    choices = [t for t in allowed if t != eos] or allowed
    return rng.choice(choices)
