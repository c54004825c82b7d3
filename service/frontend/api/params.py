"""Request bodies of the compatibility dialects, which accept JSON and form bodies alike.

LibreTranslate and DeepL clients send ``application/json``, ``application/x-www-form-urlencoded``
or ``multipart/form-data``; DeepL forms repeat ``text`` once per text. Everything becomes one
mapping of name to a string or a list of strings, then one typed request model of the dialect
(``parse``). Whatever a client sends, the outcome is that model or ``InvalidInput``: a body
nested thousands deep, a number of thousands of digits, bytes that are not UTF-8 or a form that
cannot be parsed are client errors, never a 500.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

from service.contract.errors import InvalidInput

Params = dict[str, Any]
M = TypeVar("M", bound=BaseModel)


async def read_form(request: Request) -> FormData:
    """The request's form, or ``InvalidInput`` saying why it cannot be read: Starlette's own
    limits (more than 1,000 fields, a field over 1 MiB) in its words, which are safe to show;
    any other malformed body as such."""
    try:
        return await request.form()
    except (MultiPartException, HTTPException) as error:
        # Starlette's limits: its parser's exception, which a request inside an app gets as
        # an HTTPException carrying the same message.
        said = error.message if isinstance(error, MultiPartException) else error.detail
        raise InvalidInput(f"invalid request: the form body cannot be parsed: {said}") from None
    except Exception:  # python-multipart raises several types for malformed bodies
        raise InvalidInput("invalid request: the form body cannot be parsed") from None


async def read_params(request: Request) -> Params:
    """The query's parameters, overridden by the body's (a form or a JSON object)."""
    query: Params = {}
    for key in request.query_params:
        values = request.query_params.getlist(key)
        query[key] = values if len(values) > 1 else values[0]
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await read_form(request)
        params = dict(query)
        for key in form:
            values = [value for value in form.getlist(key) if isinstance(value, str)]
            params[key] = values if len(values) > 1 else (values[0] if values else "")
        # Uploaded files are spooled to temporary files: closed here, whoever reads the form
        # (a route that wants a file reads it first: ``api.documents.read_upload``).
        await form.close()
        return params
    body = await request.body()
    if not body:
        return query
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError, JSONDecodeError too
        problem = body_problem(error, "the body is neither JSON nor a form")
        raise InvalidInput(f"invalid request: {problem}") from None
    if not isinstance(decoded, dict):
        raise InvalidInput("invalid request: the body must be a JSON object")
    return {**query, **decoded}


def body_problem(error: BaseException, otherwise: str = "the body is not JSON") -> str:
    """What is wrong with a body that did not decode as JSON, for the client, from the
    decoder's ``error`` (``otherwise`` where it says nothing more)."""
    if isinstance(error, UnicodeDecodeError):
        return "the body is not UTF-8"
    if isinstance(error, RecursionError):
        return "the body's JSON nests too deeply"
    return otherwise


def parse(
    model: type[M],
    params: Params,
    missing: str = "invalid request: missing {field} parameter",
    invalid: str = "invalid request: {field}: {msg}",
) -> M:
    """``params`` as the dialect's typed request, or ``InvalidInput`` naming the field in the
    dialect's words: ``missing`` and ``invalid`` are formatted with ``field`` (the dotted
    path), ``name`` (its first part) and ``msg`` (pydantic's)."""
    try:
        return model.model_validate(params)
    except ValidationError as error:
        problem = error.errors()[0]
        location = [str(part) for part in problem.get("loc", ())] or ["body"]
        words = {"field": ".".join(location), "name": location[0]}
        template = missing if problem.get("type") == "missing" else invalid
        raise InvalidInput(template.format(msg=problem.get("msg", "invalid"), **words)) from None
