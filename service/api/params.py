"""Request parameters for the compatibility dialects, which accept JSON and form bodies alike.

LibreTranslate and DeepL clients send ``application/json``, ``application/x-www-form-urlencoded``
or ``multipart/form-data``; DeepL forms repeat ``text`` once per text. Everything becomes one
mapping of name to a string or a list of strings.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from service.errors import InvalidInput

Params = dict[str, Any]


async def read_params(request: Request) -> Params:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        params: Params = {}
        for key in form:
            values = [value for value in form.getlist(key) if isinstance(value, str)]
            params[key] = values if len(values) > 1 else (values[0] if values else "")
        return params
    body = await request.body()
    if not body:
        return dict(request.query_params)
    try:
        decoded = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidInput("the request body is neither JSON nor a form") from None
    if not isinstance(decoded, dict):
        raise InvalidInput("the request body must be a JSON object")
    return decoded


def text_list(value: object, name: str) -> list[str]:
    """A parameter that may be one string or a list of strings."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return value
    raise InvalidInput(f"invalid request: missing or malformed {name} parameter")


def optional_text(params: Params, name: str) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"invalid request: {name} must be a string")
    return value
