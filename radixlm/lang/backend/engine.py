"""EngineBackend: the frontend backend over an in-process `radixlm.Engine` (no sockets).

Runs in the user's process, in the program worker threads. The engine returns the same dicts as
native /generate, so this backend shares the native protocol with RuntimeEndpoint and only swaps
the transport. Unless the engine declares `supports_concurrent_generate = True`, every call holds
one lock per engine, so run_batch programs interleave at request granularity instead of batching.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Iterator

from radixlm.lang.backend.native import NativeBackend
from radixlm.lang.chat_template import ChatTemplate, resolve_chat_template

_TOP_LEVEL = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "stream")


class EngineTransport:
    """Native-API dicts into `engine.generate(...)` keyword arguments.

    Calls are serialized by a lock unless the engine declares `supports_concurrent_generate = True`
    (it then batches calls from many threads itself, which is what makes run_batch fast).
    """

    def __init__(self, engine: Any, concurrent: bool | None = None):
        self.engine = engine
        if concurrent is None:
            concurrent = bool(getattr(engine, "supports_concurrent_generate", False))
        self.concurrent = concurrent
        self.lock: Any = contextlib.nullcontext() if concurrent else threading.Lock()

    def _kwargs(self, payload: dict[str, Any]) -> dict[str, Any]:
        kwargs = {name: payload[name] for name in _TOP_LEVEL if name in payload}
        kwargs["sampling_params"] = payload.get("sampling_params")
        if "input_ids" in payload:
            kwargs["input_ids"] = payload["input_ids"]
        else:
            kwargs["prompt"] = payload["text"]
        return kwargs

    def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        with self.lock:
            return self.engine.generate(**self._kwargs(payload))

    def generate_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        # The lock is held for the whole stream: the engine runs it in this thread.
        with self.lock:
            yield from self.engine.generate(**self._kwargs(payload))

    def flush_cache(self) -> Any:
        with self.lock:
            return self.engine.flush_cache()

    def server_info(self) -> dict[str, Any]:
        with self.lock:
            return self.engine.get_server_info()

    def concate_and_append(self, src_rids: list[str], dst_rid: str) -> None:
        raise NotImplementedError("the in-process engine has no concate_and_append")


def engine_chat_template(engine: Any, model_path: str) -> ChatTemplate:
    """The template from the engine's tokenizer; BOS is left out of the text when encoding adds it."""
    tokenizer = getattr(engine, "tokenizer", None)
    template = getattr(tokenizer, "chat_template", None)
    special: dict[str, str] = {}
    if tokenizer is not None and isinstance(template, str):
        eos = getattr(tokenizer, "eos_token", None)
        bos = getattr(tokenizer, "bos_token", None)
        if eos:
            special["eos_token"] = eos
        bos_id = getattr(tokenizer, "bos_token_id", None)
        adds_bos = bos_id is not None and tokenizer("a").input_ids[:1] == [bos_id]
        if bos and not adds_bos:
            special["bos_token"] = bos
    return resolve_chat_template(model_path, template if isinstance(template, str) else None, **special)


def _model_path(engine: Any) -> str:
    for attr in ("model_path", "served_model_name"):
        value = getattr(engine, attr, None)
        if isinstance(value, str):
            return value
    info = engine.get_server_info() or {}
    return str(info.get("model_path", ""))


class EngineBackend(NativeBackend):
    """Backend for `radixlm.Engine(...)`; programs accept the engine itself as `backend=`."""

    def __init__(self, engine: Any, chat_template: ChatTemplate | None = None, concurrent: bool | None = None):
        model_path = _model_path(engine)
        super().__init__(EngineTransport(engine, concurrent), model_path,
                         chat_template or engine_chat_template(engine, model_path))
        self.engine = engine

    def shutdown(self) -> None:
        self.engine.shutdown()


_BACKENDS: "weakref.WeakKeyDictionary[Any, EngineBackend]" = weakref.WeakKeyDictionary()
_BACKENDS_LOCK = threading.Lock()


def backend_for_engine(engine: Any) -> EngineBackend:
    """One backend (hence one lock) per engine, however many programs use it."""
    with _BACKENDS_LOCK:
        backend = _BACKENDS.get(engine)
        if backend is None:
            backend = _BACKENDS[engine] = EngineBackend(engine)
        return backend


def looks_like_engine(obj: Any) -> bool:
    return callable(getattr(obj, "generate", None)) and hasattr(obj, "tokenizer") \
        and callable(getattr(obj, "flush_cache", None))
