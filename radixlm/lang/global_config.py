"""Process-wide frontend settings (the default backend). Runs in the user's process."""

from __future__ import annotations

from typing import Any


class GlobalConfig:
    def __init__(self) -> None:
        self.default_backend: Any = None
        # run_batch traces the program and prefills its constant prefix once (SGLang's behaviour).
        self.enable_precache_with_tracing: bool = True
        # Prefixes shorter than this are not worth a warm-up request.
        self.min_precache_prefix_chars: int = 64


global_config = GlobalConfig()
