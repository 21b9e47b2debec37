"""RuntimeEndpoint: the frontend backend for a radixlm (or SGLang) server's native HTTP API.

Runs in the user's process. Speaks the native API exactly as the stock SGLang frontend does
(docs/wire-protocol.md), so the same program produces the same traffic against either
server. One httpx.Client is shared by all program threads (it is thread-safe and pools connections).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx

from radixlm.lang.backend.native import NativeBackend
from radixlm.lang.chat_template import get_chat_template, resolve_chat_template


class RuntimeEndpointError(RuntimeError):
    """The server answered with an error; `status` is the HTTP status, `error` its error object."""

    def __init__(self, status: int, error: Any):
        message = error.get("message", error) if isinstance(error, dict) else error
        super().__init__(f"server returned {status}: {message}")
        self.status = status
        self.error = error


def _raise_for_status(res: httpx.Response) -> None:
    if res.status_code // 100 == 2:
        return
    try:
        body = res.json()
    except ValueError:
        body = res.text
    raise RuntimeEndpointError(res.status_code, body.get("error", body) if isinstance(body, dict) else body)


class HttpTransport:
    """Native-API dicts over HTTP."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float | None = None,
                 verify: bool | str = True):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.client = httpx.Client(base_url=self.base_url, headers=headers, verify=verify,
                                   timeout=httpx.Timeout(timeout, connect=30.0))

    def get_json(self, path: str) -> Any:
        res = self.client.get(path)
        _raise_for_status(res)
        return res.json()

    def post_json(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        res = self.client.post(path, json=payload) if payload is not None else self.client.post(path)
        _raise_for_status(res)
        return res.json() if res.content else None

    def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        return self.post_json("/generate", payload)

    def generate_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        with self.client.stream("POST", "/generate", json=payload) as res:
            if res.status_code // 100 != 2:
                res.read()
                _raise_for_status(res)
            for line in res.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeEndpointError(res.status_code, event["error"])
                yield event

    def flush_cache(self) -> Any:
        return self.post_json("/flush_cache")

    def server_info(self) -> dict[str, Any]:
        # Newer servers name it /server_info, older ones /get_server_info; radixlm serves both.
        res = self.client.get("/server_info")
        if res.status_code == 404:
            res = self.client.get("/get_server_info")
        _raise_for_status(res)
        return res.json()

    def concate_and_append(self, src_rids: list[str], dst_rid: str) -> None:
        self.post_json("/concate_and_append_request", {"src_rids": src_rids, "dst_rid": dst_rid})

    def post_trace(self, data: bytes) -> dict[str, Any]:
        res = self.client.post("/dashboard/programs/traces", content=data,
                               headers={"Content-Type": "application/json"})
        _raise_for_status(res)
        return res.json()

    def close(self) -> None:
        self.client.close()


class RuntimeEndpoint(NativeBackend):
    """Backend for a running server: `RuntimeEndpoint("http://127.0.0.1:30000")`.

    The chat template is the model's own (reported by /get_model_info as `chat_template`), else the
    registry's match for `model_path`; `chat_template_name` forces a registry template.
    """

    support_concate_and_append = True

    def __init__(self, base_url: str, api_key: str | None = None, verify: bool | str = True,
                 chat_template_name: str | None = None, timeout: float | None = None, publish_traces: bool = False):
        transport = HttpTransport(base_url, api_key=api_key, timeout=timeout, verify=verify)
        self.publish_traces = publish_traces  # post every run's trace to the server (/dashboard/programs)
        self.base_url = transport.base_url
        self.api_key = api_key
        self.model_info: dict[str, Any] = transport.get_json("/get_model_info")
        model_path = str(self.model_info.get("model_path", ""))
        if chat_template_name:
            template = get_chat_template(chat_template_name)
        else:
            template = resolve_chat_template(model_path, self.model_info.get("chat_template"))
        super().__init__(transport, model_path, template)

    def can_publish_traces(self) -> bool:
        return True

    def publish_trace(self, trace: Any) -> dict[str, Any]:
        """POST the trace (radixlm/trace/schema.py) to /dashboard/programs/traces; returns {"id", "url"}."""
        from radixlm.trace.schema import encode_trace

        out = self.transport.post_trace(encode_trace(trace))
        return {**out, "url": self.base_url + out["url"]}

    def shutdown(self) -> None:
        self.transport.close()
