"""The web page over HTTP: ``GET /`` (revalidated on every visit, so a new version shows at
once) and its static files under ``/static/`` (cached for an hour by browsers and Nginx)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_MAX_AGE_S = 3600
# The page loads its own script and style only, and talks to its own origin: nothing inline,
# nothing from elsewhere, never framed.
PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


def _static_folder() -> Path:
    return Path(str(resources.files("service.frontend.web") / "static"))


class _CachedStatic(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code == 200:
            response.headers["Cache-Control"] = f"public, max-age={STATIC_MAX_AGE_S}"
        return response


def install_web_page(app: FastAPI) -> None:
    folder = _static_folder()
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def page() -> FileResponse:
        return FileResponse(
            folder / "index.html",
            media_type="text/html; charset=utf-8",
            headers={"Cache-Control": "no-cache", "Content-Security-Policy": PAGE_POLICY},
        )

    app.include_router(router)
    app.mount("/static", _CachedStatic(directory=folder), name="static")
