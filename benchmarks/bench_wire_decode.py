"""What the HTTP edge pays to decode and validate a /generate body, and the bytes of the typed wire.

Runs in the user's process, standalone and model-free: `python benchmarks/bench_wire_decode.py [--reps N]`.
Decode: the body bytes -> GenerateBody (msgspec) -> the checked SamplingParams (to_params), i.e. what
the route and generate_input.py do before tokenizing (tokenization left out: it is the same work whatever
the decoder). Sampling params are validated there only; the scheduler and the detokenizer decode the
typed Struct from msgpack (timed too). Bytes: the msgpack GenerateReq the tokenizer manager sends, and a
finished TokenOut.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import msgspec

from radixlm.runtime.messages import FinishReason, GenerateReq, TokenizedGenerateReq, TokenOut, encode
from radixlm.runtime.server.bodies import GenerateBody, decode_body
from radixlm.sampling_params import SamplingParamsIn

BODIES = {
    "small": {"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 16, "temperature": 0.7,
                                                                  "stop": ["\n"]}},
    "sglang frontend": {"text": "The quick brown fox", "sampling_params": {
        "skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 16,
        "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [], "temperature": 0.0,
        "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
        "ignore_eos": False, "regex": None, "json_schema": None}, "return_logprob": False, "stream": True},
}


def _time_us(fn, reps: int) -> float:
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - start) / reps * 1e6)
    return statistics.median(samples)


def edge(raw: bytes) -> None:
    body = decode_body(raw, GenerateBody)
    params = body.sampling_params
    params.to_params() if isinstance(params, SamplingParamsIn) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20000)
    args = parser.parse_args()
    print("| body | bytes | edge decode + validate (us) | GenerateReq bytes | scheduler/detokenizer decode (us) |")
    print("|---|---:|---:|---:|---:|")
    decoder = msgspec.msgpack.Decoder(GenerateReq)
    for name, obj in BODIES.items():
        raw = json.dumps(obj).encode()
        params = decode_body(raw, GenerateBody).sampling_params.to_params()
        msg = encode(GenerateReq(TokenizedGenerateReq("r" * 32, list(range(5)), params, stream=True), ["r" * 32]))
        print(f"| {name} | {len(raw)} | {_time_us(lambda: edge(raw), args.reps):.1f} | {len(msg)} | "
              f"{_time_us(lambda: decoder.decode(msg), args.reps):.1f} |")
    final = TokenOut("r" * 32, [5], 5, 16, 0, FinishReason("length", length=16))
    print(f"\nfinished TokenOut: {len(encode(final))} bytes")


if __name__ == "__main__":
    main()
