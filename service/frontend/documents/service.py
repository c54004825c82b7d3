"""The documents domain in one object: upload (checked and parsed before it is accepted),
status, the one download, waiting for a job, and resuming the jobs no process runs; the API
dialects call only this."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

from service.contract.errors import InvalidInput, PayloadTooLarge, ServiceError, TextTooLong
from service.frontend.documents.formats import MEDIA_TYPES, FileFormat, Unit, format_of
from service.frontend.documents.jobs import JobLimits, JobStore
from service.frontend.documents.reading import DocumentReader, ReadingConfig
from service.frontend.documents.records import Job
from service.frontend.documents.resume import Resumer, encode_request
from service.frontend.documents.runner import DocumentRunner, RunnerConfig, options_json
from service.frontend.translation.prompts import PLAIN, TranslationOptions
from service.frontend.translation.translator import Translator


@dataclass(frozen=True, slots=True)
class DocumentsConfig:
    max_file_bytes: int = 10 * 1024 * 1024
    max_file_chars: int = 1_000_000
    reading: ReadingConfig = field(default_factory=ReadingConfig)
    limits: JobLimits = field(default_factory=JobLimits)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    # The scheme and host (and port) clients reach the service at, for links to results; None:
    # the request's own (its Host header).
    public_origin: str | None = None


class Documents:
    """Document jobs of one API process (the store is shared by all of them)."""

    def __init__(
        self, store: JobStore, translator: Callable[[], Translator], config: DocumentsConfig
    ) -> None:
        self._store = store
        self._config = config
        self._reader = DocumentReader(config.reading)
        files = _StoredFiles(store, self._reader)
        self._runner = DocumentRunner(store, translator, files, config.runner)
        self._resumer = Resumer(store, self._runner, self._serving)
        self._translator = translator

    async def upload(
        self,
        owner: str,
        filename: str,
        data: bytes,
        target_lang: str,
        source_lang: str | None,
        options: TranslationOptions = PLAIN,
        charge: Callable[[int], Awaitable[None]] | None = None,
        holder: str | None = None,
    ) -> Job:
        """A job for the file, translating in the background; the file is refused (4xx) before
        any job exists when it is too large, of an unknown type, or cannot be read, or when
        ``charge`` refuses its characters (the caller's quota). ``holder``: the client whose
        slots it takes (``owner``'s when not given)."""
        if len(data) > self._config.max_file_bytes:
            raise PayloadTooLarge(f"file: over {self._config.max_file_bytes} bytes")
        if not data:
            raise InvalidInput("file: the document is empty")
        file_format: FileFormat = format_of(filename)
        # Checked now, so a wrong language is a 4xx of the upload, not a failed job.
        self._translator().languages_of(target_lang, source_lang)
        read = await self._reader.units(data, file_format, holder or owner)
        characters = read.characters
        if characters > self._config.max_file_chars:
            raise TextTooLong(
                f"file: {characters} characters to translate, at most {self._config.max_file_chars}"
            )
        if charge is not None:
            await charge(characters)
        job = await asyncio.to_thread(
            self._store.create,
            owner,
            filename,
            file_format,
            data,
            target_lang,
            source_lang,
            options_json(options),
            characters,
            encode_request(options),
            self._runner.claim,
            holder or owner,
        )
        self._runner.submit(job, options, read.units)
        return job

    async def status(self, owner: str | None, job_id: str, key: str | None) -> Job:
        return await asyncio.to_thread(self._store.get, owner, job_id, key)

    async def result(self, owner: str | None, job_id: str, key: str | None) -> tuple[Job, bytes]:
        """The result to serve; ``downloaded`` once it was sent whole (served once)."""
        return await asyncio.to_thread(self._store.result, owner, job_id, key)

    async def downloaded(self, job: Job, arrived: bool) -> None:
        """How sending ``job``'s result went: arrived (served once), or not (served again)."""
        await asyncio.to_thread(self._store.downloaded if arrived else self._store.released, job)

    async def delete(self, owner: str, job_id: str, key: str) -> None:
        """The job stopped where it runs here, and gone with its files."""
        self._runner.cancel(job_id)
        await asyncio.to_thread(self._store.delete, owner, job_id, key)

    async def wait(self, job: Job) -> Job:
        """The job once its translation in this process has ended."""
        await self._runner.wait(job.id)
        return await self.status(job.owner, job.id, job.key)

    def public_link(self, url: str) -> str:
        """``url`` (built from the request) on the service's public origin, where one is set:
        neither a port a proxy dropped nor a ``Host`` header a client made up ends up in it."""
        if self._config.public_origin is None:
            return url
        origin = urllib.parse.urlsplit(self._config.public_origin)
        return (
            urllib.parse.urlsplit(url)._replace(scheme=origin.scheme, netloc=origin.netloc).geturl()
        )

    @staticmethod
    def media_type(job: Job) -> str:
        """The type a result is served with: its own, but never one a browser renders as a
        page from the service's origin (a translated HTML file is served as text)."""
        if job.format == "html":
            return MEDIA_TYPES["txt"]
        return MEDIA_TYPES.get(job.format, "application/octet-stream")

    async def recover(self) -> None:
        """At the start of a service (its first process): jobs left unfinished by the last
        run made free to be resumed at once, and expired ones gone."""
        await asyncio.to_thread(self._store.claims.requeue_unfinished)
        await asyncio.to_thread(self._store.purge)

    def start(self) -> None:
        """Resume, in this process, jobs that no process runs (see ``resume``)."""
        self._resumer.start()

    async def close(self) -> None:
        """Stop resuming, and hand this process's jobs back to be resumed."""
        await self._resumer.close()
        await self._runner.close()
        self._store.close()

    def _serving(self) -> bool:
        try:
            self._translator()
        except ServiceError:  # loading, restarting or stopping: why does not matter here
            return False
        return True


class _StoredFiles:
    """Jobs' stored files through the reader; an accepted job's read waits for the reader
    rather than being refused."""

    def __init__(self, store: JobStore, reader: DocumentReader) -> None:
        self._store = store
        self._reader = reader

    async def units(self, job: Job) -> list[Unit]:
        data = await asyncio.to_thread(self._store.source_path(job).read_bytes)
        read = await self._reader.units(data, cast(FileFormat, job.format))
        return read.units

    async def rebuilt(self, job: Job, translations: list[str]) -> bytes:
        data = await asyncio.to_thread(self._store.source_path(job).read_bytes)
        return await self._reader.rebuilt(data, cast(FileFormat, job.format), translations)
