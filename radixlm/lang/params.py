"""GenParams: the sampling options of one `gen` (or a run()'s defaults), derived from SamplingParams.

Runs in the user's process. radixlm/sampling_params.py is the one list of sampling parameters: every
field of SamplingParams is a keyword of gen, gen_int, gen_string, run and run_batch under its own name
(plus SGLang's frontend spellings max_tokens / min_tokens). Only the options that exist in the frontend
alone are listed here: the native request's top-level logprob fields, and `dtype`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import msgspec

from radixlm.sampling_params import SamplingParams

SAMPLING_FIELDS: tuple[str, ...] = SamplingParams.__struct_fields__
# SGLang's frontend spells these SamplingParams fields differently in gen().
GEN_ALIASES: dict[str, str] = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
LOGPROB_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")
# OpenAI tool dicts and tool_choice (lang/tools.py): the frontend turns them into a grammar and parses calls.
TOOL_FIELDS = ("tools", "tool_choice")
FRONTEND_FIELDS = (*LOGPROB_FIELDS, "dtype", *TOOL_FIELDS)
# Every name run() / run_batch() take as a sampling option (the rest are program arguments).
RUN_OPTION_NAMES: frozenset[str] = frozenset((*SAMPLING_FIELDS, *FRONTEND_FIELDS))
# ... and gen(), which also takes SGLang's aliases.
GEN_OPTION_NAMES: frozenset[str] = RUN_OPTION_NAMES | frozenset(GEN_ALIASES)
# Sent in every native request whatever their value, in this order, as SGLang's to_srt_kwargs does; the
# other fields go only when the program sets them (a stock SGLang server knows no `choices`).
_ALWAYS_SENT = ("skip_special_tokens", "spaces_between_special_tokens", "max_new_tokens", "min_new_tokens",
                "n", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
                "frequency_penalty", "presence_penalty", "ignore_eos", "regex", "json_schema")
_LIST_FIELDS = ("stop", "stop_token_ids", "stop_regex")

# The regexes SGLang's frontend uses for `dtype=`; kept identical so programs behave the same.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

_DTYPE_REGEX: dict[str, tuple[str, bool]] = {
    # name -> (regex, whether whitespace ends the value)
    "int": (REGEX_INT, True),
    "float": (REGEX_FLOAT, True),
    "str": (REGEX_STR, False),
    "bool": (REGEX_BOOL, False),
}


@dataclass(frozen=True)
class GenParams:
    """Sampling parameters of one `gen`, as the frontend sees them (SGLang's SglSamplingParams).

    `sampling` holds the values (SamplingParams' own defaults where nothing was set); `explicit` names the
    fields that were set, so an override (inside `gen`) applies only those. `run()` builds the defaults
    and the interpreter merges the two with `merged_with`.
    """

    sampling: SamplingParams = field(default_factory=SamplingParams)
    explicit: frozenset[str] = frozenset()
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: type | str | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: Any = None

    def __getattr__(self, name: str) -> Any:
        """`params.temperature` etc.: backends (a plug point users implement) read the values by name,
        as on SGLang's SglSamplingParams. Only called for names that are not real attributes."""
        if name in SAMPLING_FIELDS:
            return getattr(object.__getattribute__(self, "sampling"), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "GenParams":
        """From gen() / run() keywords (SamplingParams names, SGLang's aliases, the frontend-only
        fields); a None value means "not set". Unknown names raise TypeError."""
        sampling: dict[str, Any] = {}
        frontend: dict[str, Any] = {}
        for key, value in options.items():
            name = GEN_ALIASES.get(key, key)
            if name not in RUN_OPTION_NAMES:
                raise TypeError(f"unknown sampling parameter {key!r}")
            if value is None:
                continue
            if name == "json_schema" and isinstance(value, dict):
                value = json.dumps(value)  # the wire format carries the schema as a JSON string
            if name == "regex":
                re.compile(value)  # fail at the program line, not inside the server
            (sampling if name in SAMPLING_FIELDS else frontend)[name] = value
        if frontend.get("tools") is not None:
            from radixlm.lang.tools import check_tools

            frontend["tools"], frontend["tool_choice"] = check_tools(frontend["tools"], frontend.get("tool_choice"))
        return cls(SamplingParams(**sampling), frozenset(sampling), **frontend)

    @classmethod
    def override(cls, **values: Any) -> "GenParams":
        return cls.from_options(values)

    def merged_with(self, override: "GenParams", extra_stop: tuple[str, ...] = ()) -> "GenParams":
        """These defaults with every field `override` sets applied, plus template stop strings."""
        changes = {name: getattr(override.sampling, name) for name in override.explicit}
        explicit = self.explicit | override.explicit
        if extra_stop:
            changes["stop"] = [*stop_list(changes.get("stop", self.sampling.stop)), *extra_stop]
            explicit |= {"stop"}
        frontend = {n: getattr(override, n) for n in FRONTEND_FIELDS if getattr(override, n) is not None}
        return dataclasses.replace(self, sampling=msgspec.structs.replace(self.sampling, **changes),
                                   explicit=explicit, **frontend)

    def with_dtype_applied(self) -> "GenParams":
        """Turn `dtype` into the regex (and stop strings) that constrain generation to that type."""
        if self.dtype is None:
            return self
        name = self.dtype if isinstance(self.dtype, str) else getattr(self.dtype, "__name__", "")
        if name not in _DTYPE_REGEX:
            raise ValueError(f"dtype: unsupported dtype {self.dtype!r}; use int, float, str or bool")
        regex, ends_on_space = _DTYPE_REGEX[name]
        stop = stop_list(self.sampling.stop) + ([" ", "\n"] if ends_on_space else [])
        sampling = msgspec.structs.replace(self.sampling, regex=regex, stop=stop)
        return dataclasses.replace(self, sampling=sampling, explicit=self.explicit | {"regex", "stop"}, dtype=None)

    def to_native_sampling_params(self) -> dict[str, Any]:
        """The `sampling_params` object of a native /generate request (SGLang's to_srt_kwargs)."""
        names = [*_ALWAYS_SENT, *(n for n in SAMPLING_FIELDS if n in self.explicit and n not in _ALWAYS_SENT)]
        out = {name: getattr(self.sampling, name) for name in names}
        for name in _LIST_FIELDS:
            out[name] = _as_list(out[name])
        if not self.tools:
            return out
        from radixlm.lang.tools import tool_params

        return {**out, **tool_params(self.tools, self.tool_choice, out["stop_regex"])}

    def logprob_fields(self) -> dict[str, Any]:
        """Top-level logprob fields of a native request; only those the program set."""
        return {name: getattr(self, name) for name in LOGPROB_FIELDS if getattr(self, name) is not None}


def stop_list(stop: str | list[str] | tuple[str, ...] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    return list(stop)


def _as_list(value: Any) -> list[Any]:
    """stop / stop_regex / stop_token_ids as a list (a program may give one string or one id)."""
    if isinstance(value, (str, int)):
        return [value]
    return list(value or ())
