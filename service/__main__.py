"""``python -m service``: serve the API with uvicorn.

Every setting is a flag (``--max-batch-size 16``) and an environment variable
(``HYMT_MAX_BATCH_SIZE=16``); ``--help`` lists them all. With ``HYMT_API_PROCESSES`` above 1 this
process becomes the launcher of that many API processes in front of one engine process
(``service.launcher``); otherwise it is the one API process (``service.frontend.server``).
"""

from __future__ import annotations

import logging
import sys

from pydantic import ValidationError

from service.config.settings import Settings
from service.frontend.server import serve
from service.launcher import Launcher
from service.logs import configure_logging
from service.wiring import create_service

log = logging.getLogger("service")


def main(argv: list[str] | None = None) -> None:
    try:
        settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
    except ValidationError as error:
        # What is wrong and how to set it right, as the log's one JSON line, not a traceback.
        configure_logging("info", process="api")
        log.error("invalid settings; the service does not start", extra={"errors": problems(error)})
        sys.exit(2)
    configure_logging(
        settings.observability.log_level,
        process="launcher" if settings.server.processes > 1 else "api",
    )
    if settings.uses_demo_model:
        log.warning(
            "no model configured: serving the demo model (random weights, built here); its "
            "translations are noise. Set HYMT_MODEL_ID=tencent/Hunyuan-MT-7B to translate."
        )
    if settings.server.processes > 1:
        sys.exit(Launcher(settings).run())
    sys.exit(
        serve(settings, lambda on_fatal: create_service(settings, on_fatal=on_fatal, tune_gc=True))
    )


def problems(error: ValidationError) -> list[str]:
    """Each invalid setting as ``where: why`` (pydantic's own "Value error, " left out)."""
    return [
        f"{'.'.join(str(part) for part in found['loc']) or 'settings'}: "
        f"{found['msg'].removeprefix('Value error, ')}"
        for found in error.errors(include_url=False)
    ]


if __name__ == "__main__":
    main()
