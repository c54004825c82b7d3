"""A documented request body for the routes that read their parameters themselves.

The dialect routes take a ``Request`` and parse JSON, form and query alike into their typed
models, so FastAPI cannot see a body; ``json_body(model)`` gives the route's ``openapi_extra``
the model's JSON schema (nested models written inline), so that the dialect's OpenAPI document
shows the body and a fuzzer (schemathesis, in the tests) generates it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def _inline(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        reference = node.get("$ref")
        if isinstance(reference, str) and reference.startswith("#/$defs/"):
            return _inline(definitions[reference.removeprefix("#/$defs/")], definitions)
        return {key: _inline(value, definitions) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item, definitions) for item in node]
    return node


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting ``model`` as the route's JSON body."""
    schema = model.model_json_schema(by_alias=True)
    definitions = schema.pop("$defs", {})
    inline = _inline(schema, definitions)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline}}}}
