"""A tiny fake of the radixlm server's HTTP API that records every request it receives.

It pins OUR client's wire format; it is not a model of the real server. Tokens are characters
(token id = ord(c)), so prompt lengths and logprob positions are easy to reason about; the logprob
of a character depends on it and its predecessor through `char_logprob`. Runnable as a script
(`python fake_native_server.py --port N`) for the Runtime launch test.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from radixlm.testing import CHATML_TEMPLATE

REPLY = "Paris is nice"


def char_logprob(prev: str, cur: str) -> float:
    return -((ord(cur) * 31 + ord(prev)) % 97) / 10.0


def _token_logprobs(text: str, start: int, with_text: bool) -> list[list[Any]]:
    out = []
    for i in range(start, len(text)):
        lp = None if i == start else char_logprob(text[i - 1], text[i])
        out.append([lp, ord(text[i]), text[i] if with_text else None])
    return out


def _one(prompt: str, sp: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    max_new = sp.get("max_new_tokens", 128)
    completion = REPLY[:max_new]
    meta: dict[str, Any] = {"id": "r", "prompt_tokens": len(prompt), "completion_tokens": len(completion),
                            "cached_tokens": 0, "finish_reason": {"type": "length", "length": max_new}}
    if body.get("return_logprob"):
        start = body.get("logprob_start_len", -1)
        start = len(prompt) - 1 if start == -1 else start
        with_text = bool(body.get("return_text_in_logprobs"))
        meta["input_token_logprobs"] = _token_logprobs(prompt, start, with_text)
        meta["output_token_logprobs"] = [[-0.1, ord(c), c if with_text else None] for c in completion]
    return {"text": completion, "output_ids": [ord(c) for c in completion], "meta_info": meta}


def _prompts(body: dict[str, Any]) -> tuple[list[str], bool]:
    if "input_ids" in body:
        ids = body["input_ids"]
        batch = bool(ids) and isinstance(ids[0], list)
        return ["".join(map(chr, x)) for x in (ids if batch else [ids])], batch
    text = body["text"]
    return (text, True) if isinstance(text, list) else ([text], False)


def make_app(api_key: str | None = None) -> tuple[FastAPI, list[dict[str, Any]]]:
    app = FastAPI()
    log: list[dict[str, Any]] = []

    @app.middleware("http")
    async def record(request: Request, call_next):
        raw = await request.body()
        log.append({"method": request.method, "path": request.url.path,
                    "json": json.loads(raw) if raw else None,
                    "authorization": request.headers.get("authorization")})
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "bad key", "type": "authentication_error",
                                           "param": None, "code": None}}, status_code=401)
        return await call_next(request)

    @app.get("/get_model_info")
    async def model_info():
        return {"model_path": "fake/SmolLM2-tiny-Instruct", "tokenizer_path": "fake", "is_generation": True,
                "chat_template": CHATML_TEMPLATE}

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        sp = body.get("sampling_params") or {}
        if sp.get("temperature", 1.0) > 2.0:
            return JSONResponse({"error": {"message": "temperature: must be in [0, 2]", "type": "invalid_request_error",
                                           "param": "temperature", "code": None}}, status_code=400)
        prompts, batch = _prompts(body)
        if body.get("stream"):
            return StreamingResponse(_sse(prompts[0], sp, body), media_type="text/event-stream")
        results = [_one(p, sp, body) for p in prompts]
        return results if batch else results[0]

    @app.get("/health_generate")
    async def health_generate():
        return {"ok": True}

    @app.post("/flush_cache")
    async def flush_cache():
        return {"flushed": True}

    @app.get("/server_info")
    async def server_info():
        return {"version": "fake", "max_total_num_tokens": 1024}

    @app.post("/concate_and_append_request")
    async def concat():
        return {"success": True}

    add_openai_routes(app)
    return app, log


async def _sse(prompt: str, sp: dict[str, Any], body: dict[str, Any]):
    full = _one(prompt, sp, body)
    text = full["text"]
    for i in range(1, len(text) + 1, 3):
        event = {"text": text[: i + 2], "meta_info": {**full["meta_info"], "completion_tokens": min(i + 2, len(text))}}
        yield f"data: {json.dumps(event)}\n\n"
    yield "data: [DONE]\n\n"


def add_openai_routes(app: FastAPI) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        choices = []
        for i, prompt in enumerate(prompts):
            completion = REPLY[: body.get("max_tokens", 16)]
            text = prompt + completion if body.get("echo") else completion
            logprobs = None
            # model "no-logprobs" plays a server without echoed prompt logprobs
            if body.get("logprobs") is not None and body.get("echo") and body["model"] != "no-logprobs":
                lps = [None] + [char_logprob(text[j - 1], text[j]) for j in range(1, len(text))]
                logprobs = {"tokens": list(text), "token_logprobs": lps, "top_logprobs": None,
                            "text_offset": list(range(len(text)))}
            choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": "length"})
        return {"id": "c", "object": "text_completion", "created": int(time.time()), "model": body["model"],
                "choices": choices, "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        content = "chat:" + body["messages"][-1]["content"]
        return {"id": "c", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class ServerThread:
    """Runs the fake app with uvicorn on a free port in a background thread."""

    def __init__(self, api_key: str | None = None):
        self.app, self.log = make_app(api_key)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("fake server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def requests(self, path: str) -> list[dict[str, Any]]:
        return [r for r in self.log if r["path"] == path]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args, _ = parser.parse_known_args()  # accepts every flag Runtime passes
    uvicorn.run(make_app()[0], host=args.host, port=args.port, log_level="warning")
