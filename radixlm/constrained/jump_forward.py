"""Jump-forward retokenization: turn a forced string into (tokens to drop, tokens to append).

Runs in the scheduler process. After a token is accepted, matcher.jump_forward() may return the
string every valid continuation starts with. Appending it token by token would cost one decode step
per token; instead the scheduler appends all of it as one extend step. Tokens can straddle the
boundary (`"na` + `me"` may tokenize as `"` + `name"`), so the last few output tokens are re-tokenized
together with the forced text and only the part that changed is replaced.
"""

from __future__ import annotations

from typing import Any

from radixlm.constrained.base import GrammarMatcher
from radixlm.constrained.vocabulary import TokenBytes, token_bytes_for


def _single_byte_ids(table: TokenBytes) -> dict[int, int]:
    ids: dict[int, int] = {}
    for tid, b in enumerate(table.token_bytes):
        if b is not None and len(b) == 1:
            ids.setdefault(b[0], tid)
    return ids


def jump_forward_tokens(tokenizer: Any, output_ids: list[int], forced: str,
                        max_back: int = 8) -> tuple[int, list[int]]:
    """(drop, new) with bytes(output[:-drop] + new) == bytes(output) + forced, hence the same decode.

    Tries re-tokenizing the last max_back..0 output tokens plus `forced`, keeping the first split
    whose bytes check out (a tail that starts inside a UTF-8 character or holds a special token
    cannot be re-tokenized). Falls back to one single-byte token per byte of `forced`, and to
    (0, []) ("do not jump") if the tokenizer lacks one of those bytes.
    """
    table = token_bytes_for(tokenizer)
    forced_b = forced.encode("utf-8")
    n = len(output_ids)
    for k in range(min(max_back, n), -1, -1):
        tail = list(output_ids[n - k:])
        tail_b = table.bytes_of(tail)
        if tail_b is None:
            continue
        try:
            text = tail_b.decode("utf-8") + forced
        except UnicodeDecodeError:
            continue
        new = list(tokenizer.encode(text, add_special_tokens=False))
        if table.bytes_of(new) != tail_b + forced_b:
            continue
        common = 0
        while common < min(k, len(new)) and tail[common] == new[common]:
            common += 1
        return k - common, new[common:]
    byte_ids = _single_byte_ids(table)
    if all(b in byte_ids for b in forced_b):
        return 0, [byte_ids[b] for b in forced_b]
    return 0, []


def apply_jump_forward(matcher: GrammarMatcher, tokenizer: Any, output_ids: list[int],
                       max_back: int = 8) -> tuple[int, list[int]] | None:
    """Jump the matcher over its forced string, if any: returns (drop, new) already applied to the
    matcher (the caller drops `drop` output tokens and runs `new` as an extend step), or None with
    the matcher unchanged."""
    forced = matcher.jump_forward()
    if not forced:
        return None
    drop, new = jump_forward_tokens(tokenizer, output_ids, forced, max_back)
    if not new:
        return None
    matcher.rollback(drop)
    for i, tid in enumerate(new):
        if not matcher.accept_token(tid):
            # Cannot happen when the matcher saw exactly output_ids; restore it rather than corrupt it.
            matcher.rollback(i)
            for old in output_ids[len(output_ids) - drop:]:
                matcher.accept_token(old)
            return None
    return drop, new
