"""``python -m service``: serve the API with uvicorn.

Every setting is a flag (``--max-batch-size 16``) and an environment variable
(``HYMT_MAX_BATCH_SIZE=16``); ``--help`` lists them all.
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

import uvicorn

from service.app import create_app
from service.config import Settings
from service.logs import configure_logging


def main(argv: list[str] | None = None) -> None:
    settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
    configure_logging(settings.log_level)
    # uvicorn drains on SIGTERM/SIGINT (stops accepting, finishes requests in flight, runs the
    # lifespan's drain) and then re-raises the signal it caught; with the default handlers that
    # would end the process "killed by SIGTERM". These handlers make a completed drain exit 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _drained)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        timeout_keep_alive=settings.timeout_keep_alive_s,
        timeout_graceful_shutdown=int(settings.drain_timeout_s) + 5,
        log_config=None,
        # One process owns the one GPU: scale out with one replica per GPU instead.
        workers=1,
    )


def _drained(signum: int, frame: FrameType | None) -> None:
    logging.getLogger(__name__).info("stopped", extra={"signal": signal.Signals(signum).name})


if __name__ == "__main__":
    main()
