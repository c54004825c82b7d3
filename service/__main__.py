"""``python -m service``: serve the API with uvicorn.

Every setting is a flag (``--max-batch-size 16``) and an environment variable
(``HYMT_MAX_BATCH_SIZE=16``); ``--help`` lists them all.
"""

from __future__ import annotations

import sys

import uvicorn

from service.app import create_app
from service.config import Settings
from service.logs import configure_logging


def main(argv: list[str] | None = None) -> None:
    settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
    configure_logging(settings.log_level)
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


if __name__ == "__main__":
    main()
