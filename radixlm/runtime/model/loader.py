"""Model location and loading: resolve a model path to an HF-format directory, read its config, stream
its weights and load its tokenizer.

Runs in the scheduler process (weights) and in the tokenizer/HTTP process or the user's process
(config, tokenizer). Every model ends up as an HF-format directory: a GGUF file gets one in the cache
with its config and tokenizer, its weights staying in the GGUF (gguf_loader.py), and the default model
is fetched once (see default_model.py), so the rest of radixlm reads config.json + tokenizer files, and
the weights from safetensors or the GGUF.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixlm.cache import CACHE_ENV, cache_root, file_lock  # noqa: F401 (re-exported: callers import them from here)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

@contextmanager
def atomic_output_dir(final_dir: Path) -> Iterator[Path]:
    """Yield a temp dir beside final_dir; rename it to final_dir only if the body succeeds.

    Readers test `final_dir/config.json`, so they never see a half-written directory. The caller
    holds the lock and has checked that final_dir does not exist.
    """
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-", dir=final_dir.parent))
    try:
        yield tmp
        _make_readable(tmp)
        if final_dir.exists():  # an incomplete leftover (no config.json): replace it
            shutil.rmtree(final_dir)
        tmp.rename(final_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _make_readable(directory: Path) -> None:
    """mkdtemp makes 0700 dirs (and some writers 0600 files): open the cache entry up for reading."""
    directory.chmod(0o755)
    for file in directory.iterdir():
        file.chmod(0o644)


def gguf_cache_dir(gguf_path: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where gguf_path's conversion lives: keyed by absolute path, size and mtime (a changed file reconverts)."""
    from radixlm.runtime.model.gguf_loader import CONVERTER_VERSION

    src = gguf_path.resolve()
    st = src.stat()
    key = f"{src}|{st.st_size}|{st.st_mtime_ns}|v{CONVERTER_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root(cache_dir) / "gguf" / f"{src.stem}-{digest}"


def resolve_model_path(model_path: str | os.PathLike | None, cache_dir: str | os.PathLike | None = None) -> Path:
    """Turn what the user gave into an HF-format model directory.

    None -> the default model (SmolLM2-135M-Instruct, fetched and converted once); a directory ->
    itself, if it holds config.json; a .gguf file -> its cached conversion (converted on first use).
    """
    if model_path is None:
        from radixlm.runtime.model.default_model import default_model_dir

        return default_model_dir(cache_dir)
    path = Path(model_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"Model directory {path} has no config.json: expected an HF-format model directory "
                "(config.json + *.safetensors + tokenizer files) or a .gguf file"
            )
        return path
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"Model path {path} is a file but not a .gguf file; pass a model directory or a .gguf")
        from radixlm.runtime.model.gguf_loader import prepare_gguf

        out = gguf_cache_dir(path, cache_dir)
        if (out / "config.json").is_file():
            return out
        return prepare_gguf(path, out)
    raise FileNotFoundError(
        f"Model path does not exist: {path} (radixlm does not download from a model hub: pass a local "
        "HF-format directory or a .gguf file, or no path for the default model)"
    )


def load_hf_config(model_dir: str | os.PathLike) -> dict[str, Any]:
    """config.json of an HF-format model directory, as a plain dict."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"No config.json in model directory {model_dir}")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def weight_files(model_dir: Path) -> list[Path]:
    """Safetensors files to read: the shards named by the index, or the single model.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(f"No *.safetensors weights in {model_dir} (PyTorch .bin checkpoints are not supported)")
    return found


def iter_weights(model_dir: str | os.PathLike, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF parameter name, tensor) for every tensor in the directory's safetensors, one at a time.

    Floating tensors are cast to dtype if given. A progress bar appears for sharded checkpoints, or
    after 2 s on a single file; tqdm hides it when stderr is not a terminal (tests, logs).
    """
    from tqdm.auto import tqdm

    from radixlm.runtime.model.gguf_loader import gguf_source

    gguf_path = gguf_source(model_dir)
    if gguf_path is not None:
        yield from _dequantized_gguf(model_dir, gguf_path, dtype)
        return
    files = weight_files(Path(model_dir))
    bar = tqdm(total=len(files), desc="Loading weights", unit="shard", disable=None, delay=0 if len(files) > 1 else 2)
    try:
        for file in files:
            for name, tensor in read_safetensors(file):
                if dtype is not None and tensor.is_floating_point():
                    tensor = tensor.to(dtype)
                yield name, tensor
            bar.update(1)
    finally:
        bar.close()


def _torch_dtypes() -> dict[str, torch.dtype]:
    import torch

    return {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
            "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def _header(f) -> tuple[int, dict[str, Any]]:
    """A safetensors file's header: its length in bytes and its tensor entries (metadata dropped)."""
    header_len = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(header_len))
    header.pop("__metadata__", None)
    return header_len, header


def safetensors_shapes(path: Path) -> list[list[int]]:
    """The shape of every tensor of a safetensors file, from its header alone."""
    with open(path, "rb") as f:
        return [entry["shape"] for entry in _header(f)[1].values()]


def read_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for each tensor of a safetensors file, read with plain file reads into a tensor of
    its own. Not mmap: the mapped pages of the whole file would count in the process's memory on top of
    the weights loaded from them, doubling a load's peak."""
    import torch

    dtypes = _torch_dtypes()
    with open(path, "rb") as f:
        header_len, header = _header(f)
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            if entry["dtype"] not in dtypes:
                raise ValueError(f"{path.name}: tensor {name} has dtype {entry['dtype']}, which radixlm cannot read")
            start, end = entry["data_offsets"]
            tensor = torch.empty(entry["shape"], dtype=dtypes[entry["dtype"]])
            f.seek(8 + header_len + start)
            if f.readinto(tensor.view(-1).view(torch.uint8).numpy()) != end - start:
                raise ValueError(f"{path.name} is truncated (tensor {name})")
            yield name, tensor


def _dequantized_gguf(model_dir: str | os.PathLike, gguf_path: Path, dtype: torch.dtype | None
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    from transformers import AutoConfig

    from radixlm.runtime.model.gguf_model import iter_dequantized, open_gguf

    for name, tensor in iter_dequantized(open_gguf(gguf_path), AutoConfig.from_pretrained(str(model_dir))):
        yield name, tensor if dtype is None else tensor.to(dtype)


def load_tokenizer(path: str | os.PathLike | None) -> PreTrainedTokenizerBase:
    """The fast HF tokenizer (with its chat template) of a model directory, a .gguf file, or None (default model)."""
    from transformers import AutoTokenizer

    model_dir = Path(path).expanduser() if path is not None else None
    if model_dir is None or not model_dir.is_dir():
        model_dir = resolve_model_path(path)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if not tok.is_fast:
        raise ValueError(f"No fast tokenizer (tokenizer.json) found in {model_dir}")
    return tok
