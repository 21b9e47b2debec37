"""The trace viewer's assets and the self-contained HTML file of one trace (state.save_trace).

Used in the user's process (lang writes the file) and by the HTTP process (/dashboard/programs serves the
same JavaScript). The file inlines the CSS, the JavaScript and the trace's JSON: it opens offline.
"""

from __future__ import annotations

import html
from importlib import resources

from radixlm.trace.schema import ProgramTrace, encode_trace

_STATIC = resources.files("radixlm.trace") / "static"
VIEWER_JS = (_STATIC / "trace.js").read_text(encoding="utf-8")
VIEWER_CSS = (_STATIC / "trace.css").read_text(encoding="utf-8")


def _script_safe(data: str) -> str:
    # JSON inside <script>: "</" would close the element early; "\u003c" is the same string to JSON.
    return data.replace("<", "\\u003c")


def render_html(trace: ProgramTrace) -> str:
    data = _script_safe(encode_trace(trace).decode())
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>radixlm trace: {html.escape(trace.name)}</title>
<style>body{{margin:16px}}{VIEWER_CSS}</style></head>
<body><div id="trace"></div>
<script>{VIEWER_JS}</script>
<script id="trace-data" type="application/json">{data}</script>
<script>RadixTrace.render(document.getElementById("trace"), JSON.parse(document.getElementById("trace-data").textContent));</script>
</body></html>
"""
