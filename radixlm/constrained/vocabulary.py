"""Token id -> the real bytes a token stands for, and the outlines-core Vocabulary built from it.

Runs in the scheduler process (and in the HTTP process if it validates grammars). Two tokenizer
families are handled:
  * byte-level BPE (GPT-2 style): each token string is spelled in the GPT-2 byte->unicode alphabet;
  * SentencePiece style: `▁` stands for a space and byte-fallback tokens `<0xAB>` for one raw byte.
Special tokens (EOS, chat markers, ...) have no bytes: a grammar can never produce them as text.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

# Ids of the synthetic single-byte tokens added to every outlines Vocabulary (see fsm.py): far above
# any real vocabulary, still a u32 for outlines-core. FAKE_BYTE_BASE + b is "the byte b".
FAKE_BYTE_BASE = 1 << 30
# The byte that marks "end of text" in the compiled regex `(?:R)\x00` (see fsm.py).
END_BYTE = 0
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclass(frozen=True)
class TokenBytes:
    """token_bytes[i] is the text of token i as bytes, or None (special, unused id, unmappable)."""

    token_bytes: tuple[bytes | None, ...]
    eos_token_id: int
    byte_level: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_bytes)

    def bytes_of(self, token_ids: list[int]) -> bytes | None:
        """Concatenated bytes of token_ids, or None if one of them has no bytes."""
        parts = []
        for tid in token_ids:
            b = self.token_bytes[tid] if 0 <= tid < len(self.token_bytes) else None
            if b is None:
                return None
            parts.append(b)
        return b"".join(parts)


def _bytes_to_unicode() -> dict[int, str]:
    # The GPT-2 byte <-> printable-unicode table; transformers ships it with its converters.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def _decoder_types(tokenizer: Any) -> set[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    found: set[str] = set()
    stack = [decoder]
    while stack:
        d = stack.pop()
        if isinstance(d, dict):
            if "type" in d:
                found.add(str(d["type"]))
            stack.extend(d.get("decoders") or [])
    return found


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for tid, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(tid))
    return ids


def build_token_bytes(tokenizer: Any) -> TokenBytes:
    """Map every id of a HF tokenizer to its bytes. Non-special added tokens are plain text."""
    vocab: dict[str, int] = tokenizer.get_vocab()
    special = _special_ids(tokenizer)
    added = {int(i): t.content for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()}
    byte_level = "ByteLevel" in _decoder_types(tokenizer)
    inverse = {c: b for b, c in _bytes_to_unicode().items()} if byte_level else {}
    table: list[bytes | None] = [None] * (max(vocab.values()) + 1)
    for token, tid in vocab.items():
        if tid in special:
            continue
        if tid in added:
            table[tid] = added[tid].encode("utf-8")
        elif byte_level:
            table[tid] = _decode_byte_level(token, inverse)
        else:
            table[tid] = _decode_sentencepiece(token)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("tokenizer has no EOS token; constrained decoding needs one")
    return TokenBytes(tuple(table), int(eos), byte_level)


def _decode_byte_level(token: str, inverse: dict[str, int]) -> bytes | None:
    try:
        return bytes(inverse[c] for c in token)
    except KeyError:  # not in the GPT-2 alphabet: not a byte-level token
        return None


def _decode_sentencepiece(token: str) -> bytes:
    m = _BYTE_FALLBACK.match(token)
    if m:
        return bytes([int(m.group(1), 16)])
    return token.replace("\u2581", " ").encode("utf-8")


_CACHE_LOCK = threading.Lock()
_CACHE: dict[int, tuple[Any, TokenBytes]] = {}


def token_bytes_for(tokenizer: Any) -> TokenBytes:
    """Cached build_token_bytes (the map takes ~0.1 s on a 50k vocabulary; jump-forward needs it often)."""
    with _CACHE_LOCK:
        hit = _CACHE.get(id(tokenizer))
        # The entry holds the tokenizer itself, so its id cannot be reused while cached.
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    table = build_token_bytes(tokenizer)
    with _CACHE_LOCK:
        if len(_CACHE) >= 16:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[id(tokenizer)] = (tokenizer, table)
    return table


def outlines_vocabulary_bytes(table: TokenBytes) -> bytes:
    """The outlines-core Vocabulary for `table`, serialized by outlines-core itself (sent to workers).

    Tokens containing NUL are left out: NUL is the end marker of the compiled regex, so such a token
    could walk past the end of the text. (Valid JSON never contains a raw NUL.) The synthetic ids
    FAKE_BYTE_BASE + b give every state a transition per single byte, whatever the tokenizer has.
    """
    from outlines_core import Vocabulary

    mapping: dict[bytes, list[int]] = {}
    for tid, b in enumerate(table.token_bytes):
        if b and tid != table.eos_token_id and b"\x00" not in b:
            mapping.setdefault(b, []).append(tid)
    for byte in range(256):
        mapping.setdefault(bytes([byte]), []).append(FAKE_BYTE_BASE + byte)
    vocab = Vocabulary(table.eos_token_id, mapping)
    _, (data,) = vocab.__reduce__()  # (Vocabulary.from_binary, (bincode bytes,))
    return data
