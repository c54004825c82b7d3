"""FastAPI dependencies of the native API: the runtime of its own app and the request context.

Both are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in its thread pool
(40 threads), so every request would take two thread hops and, during a flood, even ``/health``
would queue behind thousands of requests for a thread.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from service.frontend.api.context import RequestContext
from service.frontend.runtime import Runtime


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def get_context(
    request: Request,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    x_request_timeout: Annotated[
        str | None,
        Header(
            description="Seconds this request may take; lowers the server's own deadline "
            "(at least HYMT_MIN_REQUEST_TIMEOUT_S, 0.1 by default).",
        ),
    ] = None,
) -> RequestContext:
    """The caller, its deadline and the ready translator (``X-Request-Timeout`` is read by
    ``RequestContext.build``; declared here for the OpenAPI document)."""
    return await RequestContext.build(request, authorization)


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
ContextDep = Annotated[RequestContext, Depends(get_context)]
