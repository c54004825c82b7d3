"""Files over HTTP: DeepL's document API on the DeepL app (``POST /v2/document`` to upload,
``/v2/document/{id}`` for the status, ``/v2/document/{id}/result`` for the one download) and
LibreTranslate's ``/translate_file`` (which answers once the file is translated, with a link)
and ``/download_file/...`` on the LibreTranslate app.

The routes read the upload, authenticate and charge the caller, and hand the rest to
``service.frontend.documents.service.Documents``; errors go through each dialect's own error shape.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile
from starlette.types import Receive, Scope, Send

from service.contract.errors import EngineUnavailable, InvalidInput, NotFound
from service.frontend.api.context import RequestContext
from service.frontend.api.deepl_requests import (
    DeepLOptions,
    DocumentKeyParams,
    DocumentParams,
    parse_deepl,
)
from service.frontend.api.params import Params, read_form, read_params
from service.frontend.documents.records import Job
from service.frontend.documents.service import Documents
from service.frontend.translation.languages import Language
from service.frontend.translation.prompts import TranslationOptions

ContextOf = Callable[[Request, Params], Awaitable[RequestContext]]
# (the code given or None, the parameter's name) -> the language it names, or None when absent.
LanguageOf = Callable[[str | None, str], Language | None]
OptionsOf = Callable[
    [DeepLOptions, RequestContext, Language | None, Language], Awaitable[TranslationOptions]
]


async def read_upload(request: Request, name: str = "file") -> tuple[Params, str, bytes]:
    """The form's fields, and the name and bytes of its file ``name`` (a multipart upload)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "multipart/form-data":
        raise InvalidInput(f"invalid request: send the document as multipart/form-data '{name}'")
    form = await read_form(request)
    upload = form.get(name)
    data = await upload.read() if isinstance(upload, UploadFile) else None
    uploaded_name = upload.filename if isinstance(upload, UploadFile) else None
    params = await read_params(request)  # closes the form's files
    if data is None:
        raise InvalidInput(f"invalid request: missing {name} parameter (the document)")
    filename = params.get("filename") or uploaded_name or ""
    if not isinstance(filename, str) or not filename.strip():
        raise InvalidInput("invalid request: the document has no file name")
    return params, filename.strip(), data


def deepl_status(job: Job, now: float) -> dict[str, object]:
    status: dict[str, object] = {"document_id": job.id, "status": job.state}
    remaining = job.seconds_remaining(now)
    if remaining is not None:
        status["seconds_remaining"] = remaining
    if job.state == "sending":  # on its way to a client: still done, to DeepL's clients
        status["status"] = "done"
    if job.state in ("done", "sending", "downloaded"):
        status["billed_characters"] = job.characters
    if job.state == "error":
        status["error_message"] = job.error or "error"
    return status


def install_deepl_document_routes(
    app: FastAPI,
    documents: Documents,
    context_of: ContextOf,
    target_of: LanguageOf,
    source_of: LanguageOf,
    options_of: OptionsOf,
) -> None:
    def key_of(params: Params) -> str:
        key = parse_deepl(DocumentKeyParams, params).document_key
        if key is None:
            raise InvalidInput("Parameter 'document_key' not specified.")
        return key

    async def upload(request: Request) -> JSONResponse:
        params, filename, data = await read_upload(request)
        context = await context_of(request, params)
        wanted = parse_deepl(DocumentParams, params)
        target = target_of(wanted.target_lang, "target_lang")
        if target is None:
            raise InvalidInput("Parameter 'target_lang' not specified.")
        source = source_of(wanted.source_lang, "source_lang")
        output_format = wanted.output_format
        if output_format and output_format.lower() != filename.rsplit(".", 1)[-1].lower():
            raise InvalidInput("output_format: a document is translated into its own format")
        options = await options_of(wanted, context, source, target)
        job = await documents.upload(
            context.owner,
            filename,
            data,
            target.code,
            source.code if source else None,
            options,
            charge=context.charge,
            holder=context.client.identity,
        )
        return JSONResponse({"document_id": job.id, "document_key": job.key})

    app.add_api_route("/document", upload, methods=["POST"])

    async def status(request: Request, document_id: str) -> JSONResponse:
        params = await read_params(request)
        context = await context_of(request, params)
        job = await documents.status(context.owner, document_id, key_of(params))
        return JSONResponse(deepl_status(job, time.time()))

    app.add_api_route("/document/{document_id}", status, methods=["POST", "GET"])

    async def result(request: Request, document_id: str) -> Response:
        params = await read_params(request)
        context = await context_of(request, params)
        job, data = await documents.result(context.owner, document_id, key_of(params))
        return _file(job, data, documents)

    app.add_api_route("/document/{document_id}/result", result, methods=["POST", "GET"])

    async def delete(request: Request, document_id: str) -> Response:
        params = await read_params(request)
        context = await context_of(request, params)
        await documents.delete(context.owner, document_id, key_of(params))
        return Response(status_code=204)

    app.add_api_route("/document/{document_id}", delete, methods=["DELETE"])


def install_libretranslate_file_routes(
    app: FastAPI, documents: Documents, context_of: ContextOf
) -> None:
    async def translate_file(request: Request) -> JSONResponse:
        params, filename, data = await read_upload(request)
        context = await context_of(request, params)
        target = params.get("target")
        if not isinstance(target, str) or not target:
            raise InvalidInput("Invalid request: missing target parameter")
        source = params.get("source")
        source_lang = None if not isinstance(source, str) or source == "auto" else source
        job = await documents.upload(
            context.owner,
            filename,
            data,
            target,
            source_lang,
            charge=context.charge,
            holder=context.client.identity,
        )
        # LibreTranslate answers once the file is translated.
        job = await documents.wait(job)
        if job.state in ("queued", "translating"):
            # This process stopped (or gave the job up) before it finished: the client that
            # waits here cannot be told where it resumes.
            raise EngineUnavailable("the service stopped while translating the file; send it again")
        if job.state != "done":
            raise InvalidInput(f"Cannot translate file: {job.error or job.state}")
        name = urllib.parse.quote(_translated_name(job))
        link = request.url_for("download_file", token=f"{job.id}.{job.key}", name=name)
        return JSONResponse({"translatedFileUrl": documents.public_link(str(link))})

    app.add_api_route("/translate_file", translate_file, methods=["POST"])

    async def download_file(token: str, name: str) -> Response:
        job_id, _, key = token.partition(".")
        if not key:
            raise NotFound("file not found")
        job, data = await documents.result(None, job_id, key)
        return _file(job, data, documents)

    app.add_api_route(
        "/download_file/{token}/{name}", download_file, methods=["GET"], name="download_file"
    )


# Longest file name given back: a name of thousands of characters made a header so large that
# nginx refused the answer (502/503) after the result had been served once.
_MAX_NAME_CHARS = 120


def _translated_name(job: Job) -> str:
    """The result's file name: the upload's last path part (no ``../``), cut to a length any
    proxy passes, with the target language before the extension."""
    name = job.filename.replace("\\", "/").rsplit("/", 1)[-1].strip(". ") or "document"
    stem, dot, extension = name.rpartition(".")
    if not dot:
        stem, extension = name, ""
    stem = stem[: _MAX_NAME_CHARS - len(extension) - 8]
    return f"{stem}_{job.target_lang}{dot}{extension[:8]}"


class _Download(Response):
    """A result claimed for sending, marked downloaded only once its last byte was handed to
    the server: a response that fails, or a client that leaves on the way (the request is then
    cancelled), gives it back to be asked for again."""

    def __init__(self, job: Job, data: bytes, documents: Documents) -> None:
        quoted = urllib.parse.quote(_translated_name(job))
        super().__init__(
            data,
            media_type=documents.media_type(job),
            headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quoted}"},
        )
        self._job = job
        self._documents = documents

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = False
        try:
            await super().__call__(scope, receive, send)
            arrived = True
        finally:
            # Shielded: a client that leaves (even right after the last byte) cancels this
            # request, and the job must still say how its result went.
            await asyncio.shield(self._documents.downloaded(self._job, arrived))


def _file(job: Job, data: bytes, documents: Documents) -> Response:
    return _Download(job, data, documents)
