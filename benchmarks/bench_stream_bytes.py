"""Bytes on the detokenizer -> HTTP-process wire per streamed token, by output length.

Runs in the user's process, standalone and model-free: `python benchmarks/bench_stream_bytes.py [--tokens N]`.
Drives the Detokenizer (the server's own logic, no sockets) with one token per update for a streaming
request and prints the msgpack size of the BatchStrOut it sends after token 1, 10, 100, ... N; with the
tiny test tokenizer every token is a few characters. A wire that carries deltas stays flat; one that
carries the cumulative text and ids grows linearly with the output.
"""

from __future__ import annotations

import argparse
import tempfile

from transformers import AutoTokenizer

from radixlm.runtime.detokenizer import Detokenizer
from radixlm.runtime.generate_input import InputLimits, prepare_generate
from radixlm.runtime.messages import BatchStrOut, BatchTokenOut, GenerateReq, TokenOut, encode
from radixlm.testing import build_tokenizer


def measure(num_tokens: int) -> list[tuple[int, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        build_tokenizer(tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp)
    (p,), _ = prepare_generate(tokenizer, InputLimits(tokenizer.vocab_size, num_tokens + 64, 1 << 20),
                               text="The quick brown fox", stream=True, rid="r",
                               sampling_params={"max_new_tokens": num_tokens, "ignore_eos": True})
    detok = Detokenizer(tokenizer)
    detok.handle(GenerateReq(p.msg, ["r"], False))
    word_ids = [i for i in tokenizer("jumps over the lazy dog and runs far away").input_ids
                if i not in tokenizer.all_special_ids]
    marks = {1, num_tokens} | {10 ** k for k in range(1, 7) if 10 ** k < num_tokens}
    sizes = []
    for t in range(1, num_tokens + 1):
        out = TokenOut("r", [word_ids[t % len(word_ids)]], len(p.msg.input_ids), t, 0)
        reply = detok.handle(BatchTokenOut([out]))
        if t in marks and isinstance(reply, BatchStrOut):
            sizes.append((t, len(encode(reply))))
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1000)
    args = parser.parse_args()
    print("| after token | bytes of that update |\n|---:|---:|")
    for t, size in measure(args.tokens):
        print(f"| {t} | {size} |")


if __name__ == "__main__":
    main()
