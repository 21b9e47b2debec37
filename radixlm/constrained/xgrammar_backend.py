"""The xgrammar grammar backend (optional: `pip install xgrammar`): regex, JSON schema, choices,
json_object and EBNF grammars (GBNF or Lark), with xgrammar's own jump-forward.

Runs in the scheduler process (matchers, loading compiled grammars) and in compile workers
(`compile_serialized`). Compiled grammars cross the process as xgrammar's own JSON serialization.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch

from radixlm.constrained.ascii_classes import ascii_classes
from radixlm.constrained.base import CompiledGrammar, GrammarBackend, GrammarMatcher, GrammarOptions
from radixlm.constrained.bitmask import eos_only_bits, pack_bool
from radixlm.constrained.errors import GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError
from radixlm.constrained.schema_lower import lower_schema
from radixlm.constrained.vocabulary import token_bytes_for

_SHIFTS = torch.arange(32, dtype=torch.int32)
_CPP_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+\.(?:cc|h):\d+:\s*")  # "[time] file.cc:94: " (internal names)
_WORKER_STATE: dict[str, Any] = {}


def _error(param: str, err: Exception) -> GrammarError:
    text = _CPP_PREFIX.sub("", str(err).strip().splitlines()[0] if str(err).strip() else "")
    return GrammarError(param, INVALID_GRAMMAR, (text or "grammar could not be compiled")[:200])


def compile_grammar(compiler: Any, kind: str, spec: str, options: GrammarOptions) -> Any:
    """An xgrammar CompiledGrammar for a spec, or GrammarError."""
    if kind == "regex":
        if len(spec.encode()) > options.max_regex_bytes:
            raise GrammarError("regex", GRAMMAR_TOO_LARGE, f"regex larger than {options.max_regex_bytes} bytes")
        return _call("regex", compiler.compile_regex, ascii_classes(spec))
    if kind == "ebnf":  # GBNF (`root ::= ...`) natively, Lark (`start: ...`) through xgrammar's converter
        from radixlm.constrained.ebnf import check_size, syntax_of

        check_size(spec, options)
        lark = syntax_of(spec) == "lark"
        return _call("ebnf", compiler.compile_lark if lark else compiler.compile_grammar, spec)
    if kind == "choices":
        from radixlm.constrained.specs import regex_for_spec

        regex_for_spec("choices", spec, options)  # same validation as the other backend
        # EBNF string literals take JSON-style escapes, so each choice stays a literal.
        return _call("choices", compiler.compile_grammar,
                     "root ::= " + " | ".join(json.dumps(c) for c in json.loads(spec)))
    if kind == "json_object":
        return _call("response_format", compiler.compile_builtin_json_grammar)
    if kind == "json_schema":
        # What xgrammar enforces; local refs kept as $defs, external ones already refused.
        spec = json.dumps(lower_schema(spec, options, "xgrammar").schema)
        fmt: dict[str, Any] = {"any_whitespace": False, "strict_mode": True}
        fmt["separators"] = (",", ":") if options.compact else (", ", ": ")
        return _call("json_schema", compiler.compile_json_schema, spec, **fmt)
    raise GrammarError("grammar", INVALID_GRAMMAR, f"grammar kind '{kind}' is not supported")


def _call(param: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, ValueError, TypeError) as e:
        raise _error(param, e) from None


def compile_serialized(kind: str, spec: str, options: GrammarOptions, payload: bytes) -> bytes:
    """Worker entry point: payload is the serialized TokenizerInfo; returns the compiled grammar JSON."""
    import xgrammar as xgr

    if _WORKER_STATE.get("payload") != payload:
        info = xgr.TokenizerInfo.deserialize_json(payload.decode("utf-8"))
        _WORKER_STATE.update(payload=payload, compiler=xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False))
    return compile_grammar(_WORKER_STATE["compiler"], kind, spec, options).serialize_json().encode("utf-8")


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, inner: Any, eos_token_id: int, usable: torch.Tensor, usable_words: torch.Tensor,
                 jump_forward: bool):
        import xgrammar as xgr

        self._m = inner
        self._eos = eos_token_id
        self._usable = usable  # bool [V]: tokens that stand for text (xgrammar may treat e.g. a
        self._vocab_size = usable.shape[0]  # pad special token as literal text), plus EOS
        self._usable_words = usable_words  # int32 [1, ceil(V/32)]: `usable` packed
        self._jump = jump_forward
        self._words = xgr.allocate_token_bitmask(1, self._vocab_size)  # int32 [1, ceil(V/32)]

    def _bits(self) -> torch.Tensor:
        """bool [vocab_size] of the current bitmask (bit j of word w = token 32w + j)."""
        self._m.fill_next_token_bitmask(self._words)
        bits = ((self._words[0].unsqueeze(1) >> _SHIFTS) & 1).flatten()[: self._vocab_size].bool()
        return bits.logical_and_(self._usable)

    def fill_allowed_mask(self, mask: torch.Tensor) -> None:
        if self._m.is_terminated():
            mask.zero_()
            mask[self._eos] = True
            return
        bits = self._bits()
        if not bits.any():  # a dead end must not reach the sampler as an all -inf row
            bits[self._eos] = True
        mask.copy_(bits)

    def fill_bitmask(self, words: torch.Tensor) -> None:
        # xgrammar fills packed words natively: straight into the batch buffer's row when it fits.
        if self._m.is_terminated():
            eos_only_bits(words, self._eos)
            return
        fits = words.shape[0] == self._words.shape[1] and words.device.type == "cpu" and words.is_contiguous()
        target = words.unsqueeze(0) if fits else self._words
        self._m.fill_next_token_bitmask(target)
        target.bitwise_and_(self._usable_words)
        if not target.any():  # a dead end must not reach the sampler as an all -inf row
            eos_only_bits(target[0], self._eos)
        if not fits:
            n = min(words.shape[0], target.shape[1])
            words[:n].copy_(target[0, :n])
            words[n:] = 0

    def accept_token(self, token_id: int) -> bool:
        if self._m.is_terminated() or not 0 <= token_id < self._vocab_size or not self._usable[token_id]:
            return False
        return bool(self._m.accept_token(token_id))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._m.rollback(num_tokens)

    def is_terminated(self) -> bool:
        if self._m.is_terminated():
            return True
        bits = self._bits()
        bits[self._eos] = False
        return not bits.any()

    def is_accepting(self) -> bool:
        return bool(self._m.is_completed())

    def jump_forward(self) -> str | None:
        if not self._jump or self._m.is_terminated():
            return None
        return self._m.find_jump_forward_string() or None

    def copy(self) -> "XGrammarMatcher":
        return XGrammarMatcher(self._m.fork(), self._eos, self._usable, self._usable_words, self._jump)


class XGrammarGrammar(CompiledGrammar):
    def __init__(self, compiled: Any, eos_token_id: int, usable: torch.Tensor, usable_words: torch.Tensor,
                 options: GrammarOptions):
        self.compiled, self._eos, self._usable, self._options = compiled, eos_token_id, usable, options
        self._usable_words = usable_words

    def matcher(self) -> XGrammarMatcher:
        import xgrammar as xgr

        inner = xgr.GrammarMatcher(self.compiled, override_stop_tokens=[self._eos])
        return XGrammarMatcher(inner, self._eos, self._usable, self._usable_words, self._options.jump_forward)


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, options: GrammarOptions | None = None):
        import hashlib

        import xgrammar as xgr

        self.options = options or GrammarOptions()
        if self.options.whitespace_pattern is not None:
            raise ValueError("the xgrammar backend supports compact or default whitespace, not a pattern")
        self.vocab_size = vocab_size
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=[self.eos_token_id])
        self._payload = self.info.serialize_json().encode("utf-8")
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        table = token_bytes_for(tokenizer)
        self.usable = torch.zeros(vocab_size, dtype=torch.bool)
        limit = min(vocab_size, table.num_tokens)
        self.usable[:limit] = torch.tensor([b is not None for b in table.token_bytes[:limit]])
        self.usable[self.eos_token_id] = True
        self.usable_words = pack_bool(self.usable).unsqueeze(0)  # int32 [1, ceil(V/32)]
        digest = hashlib.sha256(self._payload).hexdigest()[:16]
        self._key = f"{self.name}:{digest}:{vocab_size}:{self.options.to_json()}"

    @property
    def cache_key(self) -> str:
        return self._key

    def compile(self, kind: str, spec: str) -> XGrammarGrammar:
        return self._wrap(compile_grammar(self._compiler, kind, spec, self.options))

    def worker_init_messages(self) -> list[bytes]:
        return [self.name.encode(), self.options.to_json().encode("utf-8"), self._payload]

    def load(self, data: bytes) -> XGrammarGrammar:
        import xgrammar as xgr

        return self._wrap(xgr.CompiledGrammar.deserialize_json(data.decode("utf-8"), self.info))

    def _wrap(self, compiled: Any) -> XGrammarGrammar:
        return XGrammarGrammar(compiled, self.eos_token_id, self.usable, self.usable_words, self.options)
