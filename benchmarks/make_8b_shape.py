"""Write a random-weights Llama-3-8B-shaped GGUF and quantize it to Q4_K_M with llama.cpp's quantizer: a big
file for bench_gguf_peers.py's `--8b` (load time and peak RSS only; its outputs are noise).

    .venv/bin/python benchmarks/make_8b_shape.py [--out-dir /work/models/8b-shape]
        [--tokenizer-from /work/models/qwen2.5-coder-0.5b-q4_k_m.gguf]
        [--llama-python ~/.cache/radixlm-peers/venv/bin/python] [--quantizer llama-cpp-python|binary]

Shape: Llama 3 8B (hidden 4096, 32 layers, 32 heads, 8 KV heads, head dim 128, intermediate 14336, rope theta
500000), arch "llama", untied output. The tokenizer is another GGUF's tokenizer.* metadata copied as is
(default: Qwen2.5-Coder-0.5B's byte-level BPE), and the vocabulary is that tokenizer's size (151936 for Qwen,
instead of Llama 3's 128256: ~8.2B parameters). Weights are N(0, 0.02), norms 1.

The F16 file (~16 GB) is written one tensor at a time (header and tensor infos first, then each tensor
generated and streamed out), so peak memory is about the largest tensor (the 1.2 GB embedding). It is then
quantized to Q4_K_M with llama.cpp's quantizer and deleted unless --keep-f16. The quantizer is
llama_model_quantize (what llama-quantize calls) from llama-cpp-python's libllama under --llama-python
(docs/benchmarks.md, "Building the llama.cpp side"), or with --quantizer binary the llama-quantize tool
built from the llama.cpp sources that llama-cpp-python's sdist vendors (cmake, only that target, niced, 2
jobs: ~40 min on 2 busy cores). Output: <out-dir>/llama3-8b-shape-q4_k_m.gguf.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

PEERS = Path.home() / ".cache" / "radixlm-peers"
DEFAULT_SRC = PEERS / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
DEFAULT_TOKENIZER = Path(os.environ.get("RADIXLM_GGUF_MODELS", "/work/models")) / "qwen2.5-coder-0.5b-q4_k_m.gguf"
SHAPE = {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "intermediate": 14336, "context": 8192,
         "rope_theta": 500000.0, "eps": 1e-5}
STD = 0.02
ROWS_PER_CHUNK = 4096  # rows generated at a time (fp32 scratch of 4096 x 14336 = 235 MB at most)


def tensor_shapes(vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(llama.cpp name, numpy shape [out, in]) of every tensor, in file order."""
    h, kv = SHAPE["hidden"], SHAPE["kv_heads"] * (SHAPE["hidden"] // SHAPE["heads"])
    ff = SHAPE["intermediate"]
    yield "token_embd.weight", (vocab, h)
    for i in range(SHAPE["layers"]):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (h,)
        yield b + "attn_q.weight", (h, h)
        yield b + "attn_k.weight", (kv, h)
        yield b + "attn_v.weight", (kv, h)
        yield b + "attn_output.weight", (h, h)
        yield b + "ffn_norm.weight", (h,)
        yield b + "ffn_gate.weight", (ff, h)
        yield b + "ffn_up.weight", (ff, h)
        yield b + "ffn_down.weight", (h, ff)
    yield "output_norm.weight", (h,)
    yield "output.weight", (vocab, h)


def make_tensor(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A norm (1-d): ones in f32; a matrix: N(0, STD) in f16, generated a chunk of rows at a time."""
    if len(shape) == 1:
        return np.ones(shape, dtype=np.float32)
    out = np.empty(shape, dtype=np.float16)
    for start in range(0, shape[0], ROWS_PER_CHUNK):
        rows = rng.standard_normal((min(ROWS_PER_CHUNK, shape[0] - start), shape[1]), dtype=np.float32)
        rows *= STD
        out[start: start + len(rows)] = rows
    return out


def copy_tokenizer(writer, source: Path) -> int:
    """Copy source's tokenizer.* metadata into writer; returns the vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            writer.add_key_value(key, f.contents(), f.types[0])
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def write_f16(path: Path, tokenizer: Path, seed: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    vocab = copy_tokenizer(writer, tokenizer)
    s = SHAPE
    writer.add_name("Llama-3-8B-shaped random weights")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_block_count(s["layers"])
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_feed_forward_length(s["intermediate"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_dimension_count(s["hidden"] // s["heads"])
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_layer_norm_rms_eps(s["eps"])
    writer.add_vocab_size(vocab)
    shapes = list(tensor_shapes(vocab))
    for name, shape in shapes:
        dtype = np.float32 if len(shape) == 1 else np.float16
        writer.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    t0, total = time.perf_counter(), 0
    for i, (name, shape) in enumerate(shapes):
        tensor = make_tensor(shape, rng)
        writer.write_tensor_data(tensor)
        total += tensor.nbytes
        if i % 36 == 0:
            print(f"  {name}: {total / 2**30:.1f} GiB written, {time.perf_counter() - t0:.0f} s", flush=True)
    writer.close()
    params = sum(int(np.prod(sh)) for _, sh in shapes)
    print(f"wrote {path.name} ({path.stat().st_size / 2**30:.1f} GiB, {params / 1e9:.2f}B parameters, vocab {vocab})")


def build_quantize(src: Path, build: Path) -> Path:
    """llama-quantize from the vendored llama.cpp sources (once): cmake, only that target, niced, 2 jobs."""
    exe = build / "bin" / "llama-quantize"
    if exe.exists():
        return exe
    nice = ["nice", "-n", "10"]
    subprocess.run(nice + ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                           "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
                   check=True)
    subprocess.run(nice + ["cmake", "--build", str(build), "--target", "llama-quantize", "-j", "2"], check=True)
    return exe


# llama-quantize's own call: llama_model_quantize(in, out, params) with ftype Q4_K_M, from llama-cpp-python's
# libllama (the same vendored sources, already built for bench_gguf_peers.py's llama.cpp side).
QUANTIZE_PY = """
import sys, llama_cpp as L
p = L.llama_model_quantize_default_params()
p.ftype, p.nthread = L.LLAMA_FTYPE_MOSTLY_Q4_K_M, int(sys.argv[3])
sys.exit(L.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""


def quantize(args: argparse.Namespace, f16: Path, q4: Path) -> None:
    """F16 -> Q4_K_M with llama.cpp's quantizer: the llama-quantize binary (--quantizer binary: built here
    from --llama-cpp-src if missing) or the same library function through --llama-python."""
    nice = ["nice", "-n", "10"]
    if args.quantizer == "binary":
        exe = build_quantize(Path(args.llama_cpp_src), Path(args.quantize_build))
        subprocess.run(nice + [str(exe), str(f16), str(q4), "Q4_K_M", str(args.threads)], check=True)
    else:
        subprocess.run(nice + [args.llama_python, "-c", QUANTIZE_PY, str(f16), str(q4), str(args.threads)],
                       check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="/work/models/8b-shape")
    ap.add_argument("--tokenizer-from", default=str(DEFAULT_TOKENIZER), help="a GGUF whose tokenizer.* to copy")
    ap.add_argument("--llama-cpp-src", default=str(DEFAULT_SRC), help="llama.cpp sources (llama-quantize)")
    ap.add_argument("--quantize-build", default=str(PEERS / "llama-quantize-build"))
    ap.add_argument("--quantizer", choices=("binary", "llama-cpp-python"), default="llama-cpp-python",
                    help="llama-quantize built from --llama-cpp-src, or the same llama_model_quantize call through "
                         "--llama-python (no extra build)")
    ap.add_argument("--llama-python", default=str(PEERS / "venv" / "bin" / "python"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-f16", action="store_true")
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    f16, q4 = out / "llama3-8b-shape-f16.gguf", out / "llama3-8b-shape-q4_k_m.gguf"
    if not f16.exists():
        partial = f16.with_name(f16.name + ".partial")
        write_f16(partial, Path(args.tokenizer_from), args.seed)
        partial.rename(f16)
    quantize(args, f16, q4)
    if not args.keep_f16:
        f16.unlink()
    print(f"wrote {q4} ({q4.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
