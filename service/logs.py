"""Structured JSON logging for the whole process (service and uvicorn alike).

One JSON object per line with time, level, logger, message and every ``extra`` field (request
id, route, timings). Configured by ``python -m service`` at start-up, never at import.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from transformers.utils import logging as hf_logging

# Attributes every LogRecord has; anything else on a record came in through ``extra``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured duplicate of the message
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # transformers logs through its own stderr handler and draws tqdm bars; route its records
    # into ours instead (the engine logs its own load stages with times).
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    # uvicorn's own access log would duplicate ours (which has request ids and route templates).
    logging.getLogger("uvicorn.access").disabled = True
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
