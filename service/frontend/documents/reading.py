"""Reading uploaded documents, and writing their translations back, in a child process.

Reading a document costs what its structure costs, not what its characters do: python-docx
builds an object for every element, so a 10 MB Word file of hundreds of thousands of empty-ish
paragraphs takes many seconds of CPU and hundreds of megabytes, however few characters it
holds. In the API process that work would hold the GIL from the event loop that answers every
other request, and its memory would be a client's to choose. So each read (and each rebuild of a
translated file, which reads the file again) runs in a fresh child process
(``python -m service.frontend.documents.reading``) under an address-space limit and a deadline:
a read over either is killed with everything it allocated, and the upload is answered 413; a
child that dies otherwise (a parser's crash on a hostile file) is a 422. The file and the units
travel over the child's pipes as msgpack (msgspec), never pickle: the child's output comes from
parsing a stranger's file.

At most ``at_once`` children read at a time in an API process; an upload finding ``waiting``
others already waiting, or whose client has ``per_client`` uploads reading or waiting, is
refused with 429 and a Retry-After, while the reads of accepted jobs (a resumed job's, a
rebuild) always wait their turn: refusing them would fail accepted work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from service.contract.errors import (
    InvalidInput,
    Overloaded,
    PayloadTooLarge,
    ServiceError,
    error_of,
)
from service.frontend.documents.formats import FileFormat, PackageLimits, Unit, parse

log = logging.getLogger(__name__)

# The child's own entry point: this module run with ``python -m``.
_CHILD = [sys.executable, "-m", "service.frontend.documents.reading"]


@dataclass(frozen=True, slots=True)
class ReadingConfig:
    # The most characters of one unit translated as a document (a chunk of paragraphs).
    chunk_chars: int = 50_000
    package: PackageLimits = field(default_factory=PackageLimits)
    # Children reading at once in one API process.
    at_once: int = 1
    # Uploads waiting for a child before more are refused (429).
    waiting: int = 8
    # Uploads of one client being read or waiting before its next is refused (429).
    per_client: int = 2
    # How long one read or rebuild may take, the child's start included.
    timeout_s: float = 120.0
    # Memory a child may take beyond what it holds once started (its interpreter and imports).
    memory_bytes: int = 2 * 1024**3


@dataclass(frozen=True, slots=True)
class Read:
    """A document's units to translate, and the characters they hold (what is billed)."""

    units: list[Unit]
    characters: int


class _Task(msgspec.Struct, array_like=True):
    """What the child is asked: ``units`` of a file, or the file ``rebuilt`` with
    ``translations`` (one per unit, in order)."""

    kind: Literal["units", "rebuilt"]
    data: bytes
    file_format: str
    chunk_chars: int
    package: tuple[int, int, int]
    memory_bytes: int
    translations: list[str] = []


class _Answer(msgspec.Struct, array_like=True):
    units: list[Unit] = []
    characters: int = 0
    document: bytes = b""
    # A domain error the child raised, by its code and class name; "memory" when it ran out.
    error_code: str | None = None
    error_name: str | None = None
    message: str = ""


class DocumentReader:
    """Runs reads and rebuilds in child processes, a few at a time."""

    def __init__(self, config: ReadingConfig | None = None) -> None:
        self._config = config or ReadingConfig()
        self._slots = asyncio.Semaphore(self._config.at_once)
        self._waiting = 0
        # Uploads being read or waiting, by client.
        self._clients: Counter[str] = Counter()

    async def units(self, data: bytes, file_format: FileFormat, client: str | None = None) -> Read:
        """What ``data`` holds to translate. ``client``: whose upload it is, turned away (429)
        when too many wait already or that client has ``per_client`` reading or waiting (so
        one client's heavy files cannot hold every upload up); None, an accepted job's read,
        which waits its turn instead."""
        if client is None:
            answer = await self._run("units", data, file_format, [], refuse=False)
            return Read(answer.units, answer.characters)
        if self._clients[client] >= self._config.per_client:
            raise Overloaded(
                "file: your other documents are still being read; send this one once they are "
                "accepted",
                retry_after_s=5.0,
            )
        self._clients[client] += 1
        try:
            answer = await self._run("units", data, file_format, [], refuse=True)
        finally:
            self._clients[client] -= 1
            if not self._clients[client]:
                del self._clients[client]
        return Read(answer.units, answer.characters)

    async def rebuilt(self, data: bytes, file_format: FileFormat, translations: list[str]) -> bytes:
        """``data`` with its units replaced by ``translations``."""
        answer = await self._run("rebuilt", data, file_format, translations, refuse=False)
        return answer.document

    async def _run(
        self,
        kind: Literal["units", "rebuilt"],
        data: bytes,
        file_format: FileFormat,
        translations: list[str],
        *,
        refuse: bool,
    ) -> _Answer:
        if refuse and self._slots.locked() and self._waiting >= self._config.waiting:
            raise Overloaded(
                f"file: {self._waiting} documents are waiting to be read; send it again in a "
                "few seconds",
                retry_after_s=5.0,
            )
        config = self._config
        package = config.package
        task = _Task(
            kind,
            data,
            file_format,
            config.chunk_chars,
            (package.max_unpacked_bytes, package.max_parts, package.max_ratio),
            config.memory_bytes,
            translations,
        )
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            answer = await self._in_child(msgspec.msgpack.encode(task))
        finally:
            self._slots.release()
        if answer.error_code == "memory":
            raise PayloadTooLarge(
                f"file: reading the document needs more than {config.memory_bytes // 2**20} "
                "MiB; send it in smaller parts"
            )
        if answer.error_code is not None:
            raise error_of(answer.error_code, answer.message, answer.error_name)
        return answer

    async def _in_child(self, payload: bytes) -> _Answer:
        try:
            process = await asyncio.create_subprocess_exec(
                *_CHILD,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as error:
            # The host is out of processes or memory for a moment: the file is not at fault.
            log.warning("a document reader could not start", extra={"error": str(error)})
            raise Overloaded(
                "file: the service cannot read documents right now; send it again in a few seconds",
                retry_after_s=5.0,
            ) from None
        try:
            out, err = await asyncio.wait_for(process.communicate(payload), self._config.timeout_s)
        except TimeoutError:
            raise PayloadTooLarge(
                f"file: reading the document took over {self._config.timeout_s:g} s; send it "
                "in smaller parts"
            ) from None
        finally:
            # Timed out, or the request that waited went away: the child goes too.
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if process.returncode != 0 or not out:
            # A parser that crashed on a hostile file, or a bug of the service's own: the
            # client hears only that the file could not be read; the log keeps why.
            log.warning(
                "reading a document failed",
                extra={"status": process.returncode, "stderr": err[-2000:].decode("replace")},
            )
            raise InvalidInput("file: the document could not be read")
        try:
            # Off the event loop: a file of many small paragraphs is a long list to build.
            return await asyncio.to_thread(msgspec.msgpack.decode, out, type=_Answer)
        except msgspec.DecodeError:
            raise InvalidInput("file: the document could not be read") from None


def _limit_memory(extra_bytes: int) -> int:
    """Cap the address space at what this process maps now plus ``extra_bytes``; the cap."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = mapped + extra_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


def _came_near(limit: int) -> bool:
    """Whether this process's address space came within 5% of ``limit`` (lxml reports an
    allocation that failed as a syntax error of the file, so the error alone cannot tell)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024 >= 0.95 * limit
    return False


def _answer(task: _Task) -> _Answer:
    max_unpacked_bytes, max_parts, max_ratio = task.package
    package = PackageLimits(max_unpacked_bytes, max_parts, max_ratio)
    file_format: FileFormat = task.file_format  # type: ignore[assignment]
    parsed = parse(task.data, file_format, task.chunk_chars, package)
    if task.kind == "units":
        return _Answer(units=parsed.units, characters=parsed.characters)
    return _Answer(document=parsed.rebuild(task.translations))


def _child() -> None:
    """The child: one task from stdin, its answer to stdout."""
    # Reading is throughput work; the API processes' event loops (refusals, probes) are
    # latency work, and the kernel should run them first.
    os.nice(10)
    task = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=_Task)
    limit = _limit_memory(task.memory_bytes) if sys.platform == "linux" else None
    try:
        answer = _answer(task)
    except MemoryError:
        answer = _Answer(error_code="memory")
    except ServiceError as error:
        if limit is not None and _came_near(limit):
            answer = _Answer(error_code="memory")
        else:
            answer = _Answer(
                error_code=error.code, error_name=type(error).__name__, message=error.message
            )
    sys.stdout.buffer.write(msgspec.msgpack.encode(answer))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _child()
