"""README's Python example runs as written (on the tiny model instead of the default one) and its stream
loop prints the reply once, not the cumulative text on every chunk; the CLI's --num-threads help agrees
with docs/server.md."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import radixlm

ROOT = Path(__file__).resolve().parents[1]


class RecordingEngine:
    """The tiny-model engine, remembering the last streamed chunk's (cumulative) text."""

    def __init__(self, engine):
        self.engine, self.streamed = engine, None

    def __enter__(self) -> "RecordingEngine":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def generate(self, prompt, params, stream=False):
        if not stream:
            return self.engine.generate(prompt, params)
        return self._record(self.engine.generate(prompt, params, stream=True))

    def _record(self, chunks):
        for chunk in chunks:
            self.streamed = chunk["text"]
            yield chunk


def test_readme_python_example_streams_the_reply_once(tiny_llama_dir, monkeypatch):
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    assert "radixlm.Engine()" in code
    with radixlm.Engine(str(tiny_llama_dir)) as engine:
        recorder = RecordingEngine(engine)
        monkeypatch.setattr(radixlm, "Engine", lambda *a, **k: recorder)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {})
    first_line, streamed = out.getvalue().split("\n", 1)
    assert "finish_reason" in first_line
    assert recorder.streamed is not None and streamed == recorder.streamed + "\n", out.getvalue()


def test_num_threads_help_matches_the_server_docs():
    from radixlm.runtime.cli import build_serve_parser

    help_text = " ".join(build_serve_parser().format_help().split())
    assert "one core to its IO processes on 3-8 cores" in help_text
    assert "one core fewer than the machine has on 3-8 cores" in " ".join((ROOT / "docs/server.md").read_text().split())
