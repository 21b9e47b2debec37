"""/openapi.json and /docs: the API description, built from the routes and the msgspec body Structs.

Runs in the HTTP process. FastAPI lists the routes; their request bodies are server/bodies.py's Structs
(routes name them with `openapi_extra=request_body(...)`), whose JSON Schemas msgspec writes
(`schema_components`) into components/schemas. /docs is FastAPI's Swagger UI page with its JavaScript and
CSS served from the `fastapi-offline` package under /docs/assets, so it works offline (FastAPI's default
page loads them from a CDN). That package carries Swagger UI 5, which renders the OpenAPI 3.1 that FastAPI
writes (Swagger UI 4 shows "Unable to render this definition"). Like every route but /health, all three
need an API key when keys are set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.staticfiles import StaticFiles

from radixlm.runtime.server.bodies import BODY_TYPES, SCHEMA_REF

OPENAPI_PATH = "/openapi.json"
DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
_DESCRIPTION = ("SGLang's native API (/generate and the management routes) and the OpenAI-compatible /v1 "
                "routes; docs/wire-protocol.md is the field reference, docs/robustness.md the error conventions.")


def openapi_schema(app: FastAPI, version: str) -> dict[str, Any]:
    """Built once per app: the routes' paths, and the body Structs' schemas under components/schemas."""
    if app.openapi_schema is None:
        schema = get_openapi(title="radixlm", version=version, description=_DESCRIPTION, routes=app.routes)
        _, components = msgspec.json.schema_components(BODY_TYPES, ref_template=SCHEMA_REF)
        schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
        app.openapi_schema = schema
    return app.openapi_schema


def _assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def install_docs(app: FastAPI, version: str) -> None:
    app.openapi = lambda: openapi_schema(app, version)  # type: ignore[method-assign]

    async def openapi_json(_: Request) -> JSONResponse:
        return JSONResponse(app.openapi())

    async def docs(_: Request) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=OPENAPI_PATH, title="radixlm API",
                                   swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS_PATH}/favicon.png")

    app.add_route(OPENAPI_PATH, openapi_json, include_in_schema=False)
    app.add_route(DOCS_PATH, docs, include_in_schema=False)
    app.mount(ASSETS_PATH, StaticFiles(directory=_assets_dir()), name="docs-assets")
