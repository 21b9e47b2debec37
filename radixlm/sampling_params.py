"""SamplingParams: the one definition of how a request samples, shared by lang/, runtime/ and the server.

A msgspec Struct, so it crosses processes typed (runtime/messages.py) and HTTP bodies decode straight into
it. Validated ONCE, where a request enters (runtime/generate_input.py: the Engine and the server's
tokenizer manager): `SamplingParamsIn` is the client-facing shape (every field optional, `null` = the
default, the accepted short forms such as one stop string), `SamplingParamsIn.to_params()` checks it and
returns the canonical SamplingParams that the scheduler and the detokenizer use as they are. Errors are
InvalidRequestErrors naming the field, so the server maps them to a 400 with `param` set.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Optional, Union

import msgspec
import regex

from radixlm.errors import InvalidRequestError, from_validation_error

# Limits from docs/robustness.md (configurable at the server; these are the defaults).
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_REGEX_BYTES = 4 * 1024
MAX_JSON_SCHEMA_BYTES = 1 << 20  # real schemas (GitHub workflows, compose, CircleCI) are 90-400 KB


class SamplingParamError(InvalidRequestError):
    """A sampling parameter is invalid; `param` names the field (the server reports it)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}", param=param)


class SamplingParams(msgspec.Struct, omit_defaults=True):
    """Canonical (normalized) values; omit_defaults: only the fields a request changed go on the wire."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    stop_regex: list[str] = []
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    logit_bias: dict[int, float] = {}
    sampling_seed: Optional[int] = None
    regex: Optional[str] = None
    json_schema: Optional[str] = None
    ebnf: Optional[str] = None
    # Set by the frontend's select / choices=: generate exactly one of these strings.
    choices: Optional[list[str]] = None
    # SGLang's structural_tag (JSON text or object): normalize() turns it into `ebnf` (llguidance Lark).
    structural_tag: Any = None

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SamplingParams":
        """Validate a Python dict (the Engine's and the frontend's `sampling_params`) exactly as an HTTP
        body is: msgspec converts it to SamplingParamsIn (types, unknown keys), then to_params() checks it."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise SamplingParamError("sampling_params", "must be an object")
        try:
            raw = msgspec.convert(d, SamplingParamsIn, str_keys=True)  # str_keys: {"5": 1.0} as JSON sends it
        except msgspec.ValidationError as exc:
            raise from_validation_error(exc) from None
        return raw.to_params()

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)

    def copy(self, **changes: Any) -> "SamplingParams":
        return msgspec.structs.replace(self, **changes)

    # ---- validation ---------------------------------------------------------------------------
    def normalize(self) -> None:
        """Coerce the accepted short forms (one stop string, one stop token id) and check every range."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.stop_regex, str):
            self.stop_regex = [self.stop_regex]
        if isinstance(self.stop_token_ids, int) and not isinstance(self.stop_token_ids, bool):
            self.stop_token_ids = [self.stop_token_ids]
        self.logit_bias = _parse_logit_bias(self.logit_bias)
        self._lower_structural_tag()
        self._check_types()
        self._check_ranges()

    def _lower_structural_tag(self) -> None:
        if self.structural_tag is None:
            return
        from radixlm.constrained.errors import GrammarError
        from radixlm.constrained.structural_tag import structural_tag_to_lark

        if self.ebnf is not None:
            raise SamplingParamError("structural_tag", "at most one of ebnf / structural_tag")
        try:
            self.ebnf = structural_tag_to_lark(self.structural_tag)
        except GrammarError as e:
            raise SamplingParamError("structural_tag", e.message) from None
        self.structural_tag = None  # lowered once: to_dict() -> from_dict() keeps just the ebnf

    def _check_types(self) -> None:
        """What msgspec's type check cannot say: finite floats (a Python caller can pass NaN), a non-empty
        choices list; ints for floats become floats."""
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                     "repetition_penalty"):
            setattr(self, name, _require_float(name, getattr(self, name)))
        if self.choices is not None and not self.choices:
            raise SamplingParamError("choices", "must be a non-empty list of strings")

    def _check_ranges(self) -> None:
        if self.max_new_tokens < 0:
            raise SamplingParamError("max_new_tokens", "must be >= 0")
        if self.min_new_tokens < 0:
            raise SamplingParamError("min_new_tokens", "must be >= 0")
        if self.min_new_tokens > self.max_new_tokens:
            raise SamplingParamError("min_new_tokens", "must be <= max_new_tokens")
        if not 0.0 <= self.temperature <= 2.0:
            raise SamplingParamError("temperature", "must be in [0, 2]")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamError("top_p", "must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise SamplingParamError("top_k", "must be -1 (disabled) or >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise SamplingParamError("min_p", "must be in [0, 1]")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise SamplingParamError(name, "must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise SamplingParamError("repetition_penalty", "must be in (0, 2]")
        if not 1 <= self.n <= MAX_N:
            raise SamplingParamError("n", f"must be in [1, {MAX_N}]")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise SamplingParamError("stop", f"at most {MAX_STOP_STRINGS} stop strings")
        if any(len(s) > MAX_STOP_STRING_CHARS or not s for s in self.stop):
            raise SamplingParamError("stop", f"stop strings must have 1..{MAX_STOP_STRING_CHARS} characters")
        self._check_stop_regex()
        if any(t < 0 for t in self.stop_token_ids):
            raise SamplingParamError("stop_token_ids", "token ids must be >= 0")
        if self.sampling_seed is not None and not 0 <= self.sampling_seed < 2**63:
            raise SamplingParamError("sampling_seed", "must be in [0, 2**63)")
        for bias in self.logit_bias.values():
            if not -100.0 <= bias <= 100.0:
                raise SamplingParamError("logit_bias", "bias values must be in [-100, 100]")
        self._check_grammar()

    def _check_stop_regex(self) -> None:
        if len(self.stop_regex) > MAX_STOP_STRINGS:
            raise SamplingParamError("stop_regex", f"at most {MAX_STOP_STRINGS} stop regexes")
        for pattern in self.stop_regex:
            if not pattern or len(pattern.encode()) > MAX_REGEX_BYTES:
                raise SamplingParamError("stop_regex", f"stop regexes must have 1..{MAX_REGEX_BYTES} bytes")
            try:
                regex.compile(pattern)  # the module the stop search uses (runtime/incremental_detok.py)
            except (regex.error, ValueError, OverflowError) as exc:
                raise SamplingParamError("stop_regex", f"invalid regex: {exc}") from None

    def _check_grammar(self) -> None:
        given = [name for name in ("regex", "json_schema", "ebnf") if getattr(self, name) is not None]
        if self.choices is not None:
            given.append("choices")
        if len(given) > 1:
            raise SamplingParamError(given[1], f"at most one of regex / json_schema / ebnf / choices, got {given}")
        if self.regex is not None and len(self.regex.encode()) > MAX_REGEX_BYTES:
            raise SamplingParamError("regex", f"regex larger than {MAX_REGEX_BYTES} bytes")
        if self.json_schema is not None and len(self.json_schema.encode()) > MAX_JSON_SCHEMA_BYTES:
            raise SamplingParamError("json_schema", f"schema larger than {MAX_JSON_SCHEMA_BYTES} bytes")

    def verify_vocab(self, vocab_size: int) -> None:
        """Token ids named by the request must exist in the model's vocabulary."""
        for tid in self.stop_token_ids:
            if tid >= vocab_size:
                raise SamplingParamError("stop_token_ids", f"token id {tid} is outside the vocabulary")
        for tid in self.logit_bias:
            if not 0 <= tid < vocab_size:
                raise SamplingParamError("logit_bias", f"token id {tid} is outside the vocabulary")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_grammar(self) -> bool:
        return any(x is not None for x in (self.regex, self.json_schema, self.ebnf, self.choices))


def _require_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingParamError(name, "must be a number")
    value = float(value)
    if not math.isfinite(value):
        raise SamplingParamError(name, "must be finite")
    return value


def _parse_logit_bias(bias: dict[int, float]) -> dict[int, float]:
    return {int(tid): _require_float("logit_bias", value) for tid, value in bias.items()}


# The client-facing shape, derived from SamplingParams (one list of fields): every field optional, where a
# missing field or `null` means SamplingParams' default, and the short forms clients send (one stop string,
# one stop token id). Unknown fields are a 400 naming the field.
_ACCEPTED_SHORT_FORMS: dict[str, Any] = {"stop": Union[str, list[str]], "stop_regex": Union[str, list[str]],
                                         "stop_token_ids": Union[int, list[int]]}


def _in_field(f: msgspec.structs.FieldInfo) -> tuple[str, Any, None]:
    default = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
    hint = Optional[_ACCEPTED_SHORT_FORMS.get(f.name, f.type)]
    return f.name, Annotated[hint, msgspec.Meta(description=f"default: {default!r}")], None


def _to_params(self: Any) -> SamplingParams:
    """Check the request's values (once, at the edge) and return the canonical SamplingParams."""
    given = {name: getattr(self, name) for name in self.__struct_fields__}
    params = SamplingParams(**{k: v for k, v in given.items() if v is not None})
    params.normalize()
    return params


SamplingParamsIn = msgspec.defstruct(
    "SamplingParamsIn", [_in_field(f) for f in msgspec.structs.fields(SamplingParams)],
    namespace={"to_params": _to_params, "__doc__": "The `sampling_params` object of a request."},
    forbid_unknown_fields=True, module=__name__)
