"""The interactive API documentation (``/docs``, ``/redoc``) served whole from the service:
FastAPI's own pages load Swagger UI and ReDoc from a CDN, which leaves a blank page on a host
without internet. The assets come from the ``fastapi-offline`` package."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS = "/docs-assets"


def _assets_folder() -> Path:
    return Path(str(resources.files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI), ``/redoc`` and their assets under ``/docs-assets/``."""
    router = APIRouter(include_in_schema=False)
    title = f"{app.title} - API"

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @router.get("/docs")
    async def swagger(request: Request) -> HTMLResponse:
        base = root(request)
        return get_swagger_ui_html(
            openapi_url=f"{base}{app.openapi_url}",
            title=title,
            swagger_js_url=f"{base}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{base}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{base}{ASSETS}/favicon.png",
            oauth2_redirect_url=f"{base}/docs/oauth2-redirect",
        )

    @router.get("/docs/oauth2-redirect")
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @router.get("/redoc")
    async def redoc(request: Request) -> HTMLResponse:
        base = root(request)
        return get_redoc_html(
            openapi_url=f"{base}{app.openapi_url}",
            title=title,
            redoc_js_url=f"{base}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{base}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )

    app.include_router(router)
    app.mount(ASSETS, StaticFiles(directory=_assets_folder()), name="docs-assets")
