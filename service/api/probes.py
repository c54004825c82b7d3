"""Operational routes: readiness (``/health``), liveness (``/live``) and ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from service.api.dependencies import RuntimeDep
from service.api.errors import service_error_response
from service.api.schemas import ErrorResponse, HealthOut
from service.errors import ServiceError
from service.metrics import PROMETHEUS_CONTENT_TYPE
from service.runtime import State

router = APIRouter(tags=["operations"])


@router.get(
    "/health",
    response_model=HealthOut,
    responses={503: {"model": ErrorResponse, "description": "Not ready or engine unavailable"}},
)
async def health(runtime: RuntimeDep) -> HealthOut | JSONResponse:
    """Readiness: 200 once the model is loaded and warm, 503 while loading or when it failed."""
    try:
        runtime.translator  # noqa: B018 - raises the reason the runtime cannot serve
    except ServiceError as error:
        return service_error_response(error)
    info = runtime.engine_info
    return HealthOut(
        status=State.READY.value,
        model=info.model if info else None,
        device=info.device if info else None,
        quantization=info.quantization if info else None,
        attention=info.attention if info else None,
        compiled_norms=info.compiled_norms if info else None,
        queue_depth=runtime.queue_depth,
    )


@router.get("/live", response_model=HealthOut, responses={503: {"model": ErrorResponse}})
async def live(runtime: RuntimeDep) -> HealthOut | JSONResponse:
    """Liveness: 200 while the process can still become or stay ready; 503 after a failed load
    or while the worker is stalled (a hung CUDA call cannot be interrupted: restart me)."""
    if runtime.state is State.FAILED or runtime.stalled:
        return service_error_response(runtime.failure())
    return HealthOut(status=runtime.state.value, queue_depth=runtime.queue_depth)


@router.get("/metrics", response_class=Response)
async def metrics(runtime: RuntimeDep) -> Response:
    """Prometheus metrics in the text exposition format."""
    return Response(runtime.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)
