"""Program traces: the record of one `@function` run or `run_batch` (radixlm/lang records it), its wire
schema (schema.py: what the runtime-endpoint backend posts to a server's /dashboard/programs), the
self-contained HTML viewer (html.py) and the optional OpenTelemetry export (otel.py).

Below both lang/ (which records traces) and runtime/server/ (which stores and shows them): imports neither.
"""
