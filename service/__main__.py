"""``python -m service``: serve the API with uvicorn.

Every setting is a flag (``--max-batch-size 16``) and an environment variable
(``HYMT_MAX_BATCH_SIZE=16``); ``--help`` lists them all.

Shutdown order matters: on SIGTERM (or SIGINT) the runtime drains first (admission closes, new
requests get a JSON 503 with Retry-After, texts in flight get ``drain_timeout_s`` to finish and
the rest a JSON 503), and only then is uvicorn told to stop. Left to itself, uvicorn would cancel
the request tasks still running (text/plain 500s) before the lifespan's drain ever ran. A second
signal stops at once. Exit status: 0 after a drain; 1 when the engine could not be (re)started.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from types import FrameType

import uvicorn
from fastapi import FastAPI

from service.app import create_app
from service.config import Settings
from service.logs import configure_logging
from service.runtime import Runtime

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first exit signal drains the runtime before stopping."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime, drain_timeout_s: float) -> None:
        super().__init__(config)
        self._runtime = runtime
        self._drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self.exit_code = 0

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        self._draining = True
        log.info("stopping", extra={"signal": signal.Signals(sig).name})
        self._loop.call_soon_threadsafe(
            lambda: self._loop and self._loop.create_task(self._drain())
        )

    def fatal(self) -> None:
        """The engine cannot be (re)started: stop with status 1 for the orchestrator."""
        self.exit_code = 1
        self.should_exit = True

    async def _drain(self) -> None:
        try:
            await self._runtime.drain(self._drain_timeout_s)
        finally:
            self.should_exit = True


def main(argv: list[str] | None = None) -> None:
    settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
    configure_logging(settings.log_level)
    # uvicorn re-raises the signal it caught once it has stopped; with the default handlers that
    # would end the process "killed by SIGTERM". These handlers make a completed drain exit 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stopped)
    holder: list[DrainingServer] = []
    app: FastAPI = create_app(settings, on_fatal=lambda: holder[0].fatal(), tune_gc=True)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        timeout_keep_alive=settings.timeout_keep_alive_s,
        backlog=settings.listen_backlog,
        # Requests are answered by the drain already; this only bounds slow client writes.
        timeout_graceful_shutdown=5,
        log_config=None,
        # One process owns the one GPU: scale out with one replica per GPU instead.
        workers=1,
    )
    server = DrainingServer(config, app.state.runtime, settings.drain_timeout_s)
    holder.append(server)
    server.run()
    sys.exit(server.exit_code)


def _stopped(signum: int, frame: FrameType | None) -> None:
    logging.getLogger(__name__).info("stopped", extra={"signal": signal.Signals(signum).name})


if __name__ == "__main__":
    main()
