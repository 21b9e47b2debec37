"""The error envelope of every non-2xx response (robustness.md), and the exception handlers that make
FastAPI/Starlette use it instead of their own shapes (422 validation errors, 404/405 pages).

Runs in the HTTP process.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixlm.errors import InvalidRequestError
from radixlm.runtime.messages import RequestError

logger = logging.getLogger("radixlm.server")

_TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
                   503: "service_unavailable"}
RETRY_AFTER_S = "1"


class APIError(Exception):
    """Raised by route code; becomes the envelope with this status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPE_BY_STATUS.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    headers = {"Retry-After": RETRY_AFTER_S} if status == 503 else None
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def error_bytes(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps(error_body(status, message, param, code)).encode()


def from_invalid(exc: InvalidRequestError) -> APIError:
    return APIError(400, str(exc), exc.param, exc.code)


def from_request_error(err: RequestError) -> APIError:
    """A request the scheduler refused or failed (messages.RequestError, typed end to end)."""
    return APIError(err.status, err.message, err.param, err.code)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(InvalidRequestError)
    async def _invalid(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return error_response(400, str(exc), exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        loc = errors[0].get("loc", ()) if errors else ()
        param = ".".join(str(p) for p in loc if p not in ("body", "query", "path")) or None
        return error_response(400, "invalid request", param, "invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return error_response(404, "unknown route", None, "not_found")
        if exc.status_code == 405:
            return error_response(405, "method not allowed", None, "method_not_allowed")
        return error_response(exc.status_code, str(exc.detail)[:200])

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error")  # the client gets no internals
        return error_response(500, "internal server error", None, "internal_error")
