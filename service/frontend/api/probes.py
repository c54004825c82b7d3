"""Operational routes: readiness (``/health``), liveness (``/live``) and ``/metrics``; the
probes answer ``HEAD`` (status only) and ``OPTIONS`` as well as ``GET``."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from service.contract.errors import EngineUnavailable
from service.frontend.api.dependencies import RuntimeDep
from service.frontend.api.errors import service_error_response
from service.frontend.api.schemas import ErrorResponse, HealthOut, LiveOut
from service.frontend.metrics import PROMETHEUS_CONTENT_TYPE

router = APIRouter(tags=["operations"])


@router.head("/health", include_in_schema=False, response_model=None)
@router.get(
    "/health",
    response_model=HealthOut,
    responses={503: {"model": ErrorResponse, "description": "Not ready or engine unavailable"}},
)
async def health(runtime: RuntimeDep) -> HealthOut | JSONResponse:
    """Readiness: 200 once the model is loaded and warm, 503 while loading or when it failed."""
    failure = runtime.failure()
    if failure is not None:
        return service_error_response(failure)
    info = runtime.engine_info
    return HealthOut(
        status="ready",
        engine=runtime.engine_kind,
        model=info.model if info else None,
        device=info.device if info else None,
        quantization=info.quantization if info else None,
        attention=info.attention if info else None,
        in_flight=runtime.in_flight,
        shared_state=None if runtime.redis is None else ("up" if runtime.redis.up else "down"),
    )


@router.head("/live", include_in_schema=False, response_model=None)
@router.get("/live", response_model=LiveOut, responses={503: {"model": ErrorResponse}})
async def live(runtime: RuntimeDep) -> LiveOut | JSONResponse:
    """Liveness: 200 while the engine loads or serves; 503 once it died, hung or stalled (until
    its restart is warm) or could not be started at all (restart me)."""
    if not runtime.live:
        failure = runtime.failure() or EngineUnavailable("the engine is not running")
        return service_error_response(failure)
    return LiveOut(engine_state=runtime.state.value, in_flight=runtime.in_flight)


@router.get("/metrics", response_class=Response)
async def metrics(runtime: RuntimeDep) -> Response:
    """Prometheus metrics in the text exposition format."""
    return Response(runtime.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)


@router.options("/health", include_in_schema=False)
@router.options("/live", include_in_schema=False)
@router.options("/metrics", include_in_schema=False)
async def probe_options() -> Response:
    """What a probe route allows (some load balancers and monitors ask first)."""
    return Response(status_code=204, headers={"Allow": "GET, HEAD, OPTIONS"})
