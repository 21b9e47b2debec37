"""radixlm: SGLang-style structured LLM programs over a fast serving runtime.

Public API of the frontend language (runs in the user's process). `import radixlm as sgl` runs
SGLang frontend programs unchanged. Importing this package never imports torch: `Engine` (the
in-process runtime), `OpenAI` (needs the `openai` package) and `RuntimeEndpoint` (httpx) load on
first use.
"""

from __future__ import annotations

from typing import Any

from radixlm.lang.api import (Runtime, assistant, assistant_begin, assistant_end, flush_cache, function, gen,
                              gen_int, gen_string, get_server_info, select, set_default_backend, system,
                              system_begin, system_end, user, user_begin, user_end)
from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.choices import (greedy_token_selection, token_length_normalized,
                                  unconditional_likelihood_normalized)
from radixlm.lang.global_config import global_config
from radixlm.lang.program import SglFunction
from radixlm.lang.state import ProgramState, ProgramStateGroup
from radixlm.sampling_params import SamplingParams

__version__ = "0.1.0"

_LAZY = {
    "Engine": ("radixlm.runtime.engine", "Engine"),
    "OpenAI": ("radixlm.lang.backend.openai", "OpenAI"),
    "EngineBackend": ("radixlm.lang.backend.engine", "EngineBackend"),
    "RuntimeEndpoint": ("radixlm.lang.backend.runtime_endpoint", "RuntimeEndpoint"),
}


def __getattr__(name: str) -> Any:
    # Heavy or optional dependencies load on first use, so `import radixlm` stays light.
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")


__all__ = [
    "Engine", "OpenAI", "EngineBackend", "Runtime", "RuntimeEndpoint", "BaseBackend", "SamplingParams",
    "function", "gen", "gen_int", "gen_string", "select", "system", "user", "assistant", "system_begin",
    "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end", "set_default_backend",
    "flush_cache", "get_server_info", "global_config", "SglFunction", "ProgramState", "ProgramStateGroup",
    "token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized",
]
