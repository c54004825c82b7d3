"""The one place where errors become HTTP responses.

Domain errors map to status codes by type in ``STATUS_BY_ERROR``; validation errors, unknown
routes and unexpected exceptions are answered in the same ``{"error": {"code", "message"}}``
shape. Unexpected exceptions are logged with their traceback and answered 500 without internals.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from service.contract import errors
from service.frontend.api.params import body_problem

log = logging.getLogger(__name__)

# Most specific first: the first matching type wins.
STATUS_BY_ERROR: tuple[tuple[type[errors.ServiceError], int], ...] = (
    (errors.InvalidInput, 422),
    (errors.Unauthenticated, 401),
    (errors.Forbidden, 403),
    (errors.LimitReached, 403),
    (errors.NotFound, 404),
    (errors.MethodNotAllowed, 405),
    (errors.PayloadTooLarge, 413),
    (errors.UnsupportedEncoding, 415),
    (errors.Overloaded, 429),
    (errors.DeadlineExceeded, 504),
    (errors.NotReady, 503),
    (errors.EngineUnavailable, 503),
    (errors.OutOfMemory, 507),
    (errors.StorageFull, 507),
    (errors.GenerationFailed, 500),
)


StatusOverrides = Mapping[type[errors.ServiceError], int]
ErrorBody = Callable[[errors.ServiceError], object]


def status_of(error: errors.ServiceError, overrides: StatusOverrides | None = None) -> int:
    """The status of ``error``: a dialect's override for its type, else the shared table."""
    for table in ((overrides or {}).items(), STATUS_BY_ERROR):
        for kind, status in table:
            if isinstance(error, kind):
                return status
    return 500


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def service_error_response(
    error: errors.ServiceError,
    overrides: StatusOverrides | None = None,
    body: ErrorBody | None = None,
) -> JSONResponse:
    """The response for a domain error: native shape, or a dialect's ``body`` and statuses."""
    headers: dict[str, str] = {}
    if isinstance(error, errors.Overloaded):
        headers["Retry-After"] = str(math.ceil(error.retry_after_s))
    elif isinstance(error, errors.EngineUnavailable | errors.NotReady | errors.StorageFull):
        headers["Retry-After"] = "5"
    elif isinstance(error, errors.Unauthenticated):
        headers["WWW-Authenticate"] = "Bearer"
    if body is not None:
        return JSONResponse(body(error), status_code=status_of(error, overrides), headers=headers)
    return error_response(status_of(error, overrides), error.code, error.message, headers)


@dataclass(frozen=True, slots=True)
class Dialect:
    """An API's own error shape: statuses that differ from the shared table, and the body."""

    prefix: str
    overrides: StatusOverrides
    body: ErrorBody | None

    def response(self, error: errors.ServiceError) -> JSONResponse:
        return service_error_response(error, self.overrides, self.body)


NATIVE = Dialect("", {}, None)


def install_dialect_errors(app: FastAPI, dialect: Dialect) -> None:
    """Answer a compatibility dialect's domain errors, its unknown routes and methods, and any
    unexpected error (logged; a 500 without internals), in that API's own shape and statuses."""

    async def on_service_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, errors.ServiceError)
        return dialect.response(error)

    async def on_http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HTTPException)
        if error.status_code == 405:
            response = dialect.response(errors.MethodNotAllowed("Method not allowed"))
            response.headers.update(error.headers or {})  # Allow
            return response
        if error.status_code == 404:
            return dialect.response(errors.NotFound("Not found"))
        return dialect.response(errors.InvalidInput(str(error.detail)))

    async def on_unexpected(request: Request, error: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=error)
        return dialect.response(errors.ServiceError("internal server error"))

    app.add_exception_handler(errors.ServiceError, on_service_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)


def install_error_handlers(app: FastAPI) -> None:
    async def on_service_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, errors.ServiceError)
        return service_error_response(error)

    async def on_validation_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        problems = [
            f"{_location(problem.get('loc', ()))}: {problem.get('msg', 'invalid')}"
            for problem in error.errors()
        ]
        message = "; ".join(problems) or "invalid request"
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if request.method == "POST" and kind and not kind.endswith("json"):
            # A form or plain-text body where the native API reads JSON: say so first.
            message = (
                f"send the body as JSON (Content-Type: application/json), not {kind}; {message}"
            )
        return error_response(422, "validation_error", message)

    async def on_http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HTTPException)
        if error.status_code == 400:
            # FastAPI's answer to a body it cannot decode (not UTF-8, or JSON nested past the
            # parser's depth; the decoder's error is its cause): the same class of client error
            # as malformed JSON, which it answers 422; keep one status for both.
            cause = error.__cause__ or error
            return error_response(422, "validation_error", body_problem(cause))
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        return error_response(error.status_code, code, str(error.detail), error.headers)

    async def on_unexpected(request: Request, error: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=error)
        return error_response(500, "internal_error", "internal server error")

    app.add_exception_handler(errors.ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)


def _location(loc: object) -> str:
    """``("body", "texts", 3)`` -> ``texts[3]``: the field a client sent, without "body"."""
    parts = [part for part in loc if part != "body"] if isinstance(loc, (list, tuple)) else []
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"
