"""GGUF file -> an HF-format model directory: config.json, tokenizer files and where the weights are.

prepare_gguf (every GGUF a user passes): the directory holds config.json, the tokenizer and
GGUF_MARKER naming the GGUF file, whose weights the scheduler then reads in place (gguf_model.py): no copy of
the weights is written. convert_gguf (the default model only, whose tests compare with transformers on the
same fp32 files): the directory also holds the weights dequantized to float32 safetensors.

Runs once per GGUF file, in whichever process first resolves the model (the user's process, the
engine, or the scheduler process). Writing is atomic (a temp dir beside the target, then renamed) and
serialized across processes by an fcntl file lock.

Tensors are read with gguf.GGUFReader and dequantized with gguf.quants.dequantize (F32, F16, BF16,
Q8_0, Q4_0, Q4_1, Q5_*, K-quants, IQ*: whatever the package implements). llama.cpp names are mapped
to HF names; for the llama arch, llama.cpp's convert_hf_to_gguf permuted the q/k rows (interleaved
rotary halves), which is undone here. qwen2/qwen3 are stored unpermuted.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from radixlm.runtime.model.gguf_meta import (
    NON_PARAMETER_TENSORS, build_hf_config, gguf_arch, hf_tensor_name, read_field,
)
from radixlm.runtime.model.loader import atomic_output_dir, file_lock

logger = logging.getLogger(__name__)

# Bump when the output format changes, so cached conversions from an older radixlm are redone.
CONVERTER_VERSION = 2
# The file in a prepared directory that names its GGUF (JSON: {"gguf": absolute path}).
GGUF_MARKER = "gguf.json"

# Converted weights are written in shards of at most this many bytes (peak memory while converting).
SHARD_BYTES = 2 << 30


def _save_part(tensors: dict[str, Any], out_dir: Path, index: int) -> list[str]:
    from safetensors.torch import save_file

    save_file(tensors, str(out_dir / f"part-{index}.safetensors"), metadata={"format": "pt"})
    return list(tensors)


def _name_shards(out_dir: Path, groups: list[list[str]], total_bytes: int) -> None:
    """HF naming: one file is model.safetensors; several are model-0000i-of-0000n.safetensors + an index."""
    if len(groups) == 1:
        (out_dir / "part-0.safetensors").rename(out_dir / "model.safetensors")
        return
    weight_map: dict[str, str] = {}
    for i, names in enumerate(groups):
        final = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        (out_dir / f"part-{i}.safetensors").rename(out_dir / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _write_weights(reader: Any, config: Any, out_dir: Path, progress: bool) -> None:
    """Dequantize into float32 safetensors, in shards of at most SHARD_BYTES so big models fit in RAM."""
    import torch
    from tqdm.auto import tqdm

    from radixlm.runtime.model.gguf_model import iter_dequantized

    groups: list[list[str]] = []
    pending: dict[str, torch.Tensor] = {}
    pending_bytes = total_bytes = 0
    tensors = tqdm(iter_dequantized(reader, config), desc="Dequantizing GGUF", unit="tensor",
                   total=len(reader.tensors), disable=None if progress else True)
    for name, values in tensors:
        if pending and pending_bytes + values.nbytes > SHARD_BYTES:
            groups.append(_save_part(pending, out_dir, len(groups)))
            pending, pending_bytes = {}, 0
        pending[name] = values
        pending_bytes += values.nbytes
        total_bytes += values.nbytes
    groups.append(_save_part(pending, out_dir, len(groups)))
    _name_shards(out_dir, groups, total_bytes)


def _write_tokenizer(gguf_path: Path, out_dir: Path, chat_template: str | None, config: Any = None) -> None:
    """Build a fast tokenizer from the GGUF metadata with transformers (tokenizer only, no weights).

    With the config, its tokenizer class is asked directly: AutoTokenizer would first read the whole file's
    metadata through gguf.GGUFReader to find the class, which takes most of the time on a large vocabulary.
    """
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    logger.info("Building the tokenizer from %s's metadata", gguf_path.name)
    cls = TOKENIZER_MAPPING.get(type(config), AutoTokenizer) if config is not None else AutoTokenizer
    cls = next(c for c in cls if c is not None) if isinstance(cls, tuple) else cls
    tok = cls.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if chat_template:  # the GGUF's own template wins over anything the converter guessed
        tok.chat_template = chat_template
    tok.save_pretrained(str(out_dir))


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, progress: bool = True) -> Path:
    """Convert gguf_path into an HF-format directory at out_dir (once; a no-op if it already exists).

    Raises FileNotFoundError for a missing file and ValueError for an unsupported architecture,
    tensor name or tensor type (in which case nothing is left in the cache).
    """
    import gguf
    from transformers import GenerationConfig

    src, out = Path(gguf_path), Path(out_dir)
    if not src.is_file():
        raise FileNotFoundError(f"GGUF file not found: {src}")
    with file_lock(out.with_name(out.name + ".lock")):
        if (out / "config.json").is_file():  # another process finished while we waited
            return out
        reader = gguf.GGUFReader(str(src))
        arch = gguf_arch(reader)
        config = build_hf_config(reader, arch)
        with atomic_output_dir(out) as tmp:
            _write_weights(reader, config, tmp, progress)
            _write_tokenizer(src, tmp, read_field(reader, "tokenizer.chat_template"), config)
            GenerationConfig.from_model_config(config).save_pretrained(str(tmp))
            config.save_pretrained(str(tmp))  # last: config.json marks a complete directory
    return out


def prepare_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write out_dir's config, tokenizer and GGUF_MARKER for gguf_path (once; a no-op if it exists).

    Raises FileNotFoundError for a missing file and ValueError for an unsupported architecture.
    """
    from transformers import GenerationConfig

    from radixlm.runtime.model.gguf_file import GGUFFile

    src, out = Path(gguf_path).resolve(), Path(out_dir)
    if not src.is_file():
        raise FileNotFoundError(f"GGUF file not found: {src}")
    with file_lock(out.with_name(out.name + ".lock")):
        if (out / "config.json").is_file():  # another process finished while we waited
            return out
        reader = GGUFFile(src)
        arch = gguf_arch(reader)
        config = build_hf_config(reader, arch)
        for t in reader.tensors:  # every name maps, or the error comes now rather than at load
            if t.name not in NON_PARAMETER_TENSORS:
                hf_tensor_name(t.name, arch)
        with atomic_output_dir(out) as tmp:
            _write_tokenizer(src, tmp, read_field(reader, "tokenizer.chat_template"), config)
            GenerationConfig.from_model_config(config).save_pretrained(str(tmp))
            (tmp / GGUF_MARKER).write_text(json.dumps({"gguf": str(src)}))
            config.save_pretrained(str(tmp))  # last: config.json marks a complete directory
    return out


def gguf_source(model_dir: str | os.PathLike) -> Path | None:
    """The GGUF file a prepared directory reads its weights from, or None for a directory of weights."""
    marker = Path(model_dir) / GGUF_MARKER
    if not marker.is_file():
        return None
    path = Path(json.loads(marker.read_text())["gguf"])
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} reads its weights from {path}, which no longer exists")
    return path
