"""The public API: SGLang's frontend names exist, and `import radixlm` stays free of torch."""

from __future__ import annotations

import subprocess
import sys

import radixlm as sgl

SGLANG_FRONTEND_NAMES = [
    "function", "gen", "gen_int", "gen_string", "select", "system", "user", "assistant", "system_begin",
    "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end", "set_default_backend",
    "flush_cache", "get_server_info", "Runtime", "RuntimeEndpoint", "OpenAI", "Engine",
]


def test_sglang_frontend_names_exist():
    missing = [name for name in SGLANG_FRONTEND_NAMES if not hasattr(sgl, name)]
    assert missing == []


def test_import_does_not_load_torch_or_http_clients():
    code = ("import sys, radixlm; "
            "assert 'torch' not in sys.modules and 'httpx' not in sys.modules, sorted(sys.modules); "
            "radixlm.RuntimeEndpoint; assert 'httpx' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
