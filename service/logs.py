"""Structured JSON logging for the whole process (service and uvicorn alike).

One JSON object per line with time, level, logger, message and every ``extra`` field (request
id, route, timings). Configured by ``python -m service`` at start-up, never at import.

Every request writes an access line, so under a flood of refusals logging was the largest part
of a refusal's cost on the event loop. Hence msgspec for the JSON, the timestamp formatted once
a second, and the record attributes nobody reads (caller's file and line, thread, process
names) switched off as the logging documentation's "Optimization" section describes.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import msgspec

# Attributes every LogRecord has; anything else on a record came in through ``extra``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured duplicate of the message
}


class _Tag(logging.Filter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self._process = process

    def filter(self, record: logging.LogRecord) -> bool:
        record.process_kind = self._process
        return True


class _KnownRopeKeys(logging.Filter):
    """Drops transformers' warning that Hunyuan's ``alpha`` is not a known RoPE key: the model's
    loading code applies it (alpha-scaled NTK), and the warning came four times on every start,
    telling an operator something was wrong when nothing is."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("Unrecognized keys in `rope_parameters`" in message and "'alpha'" in message)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._encoder = msgspec.json.Encoder(enc_hook=str)
        # (second, its text), replaced whole: handlers of several threads may format at once.
        self._stamp = (-1, "")

    def _time(self, created: float) -> str:
        """RFC 3339 in UTC with milliseconds (``2026-12-01T23:09:35.123Z``): unambiguous across
        hosts and time zones, and fine enough to order a request's lines."""
        second = int(created)
        cached, text = self._stamp
        if second != cached:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._stamp = (second, text)
        return f"{text}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self._time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return self._encoder.encode(entry).decode()


def configure_logging(level: str, *, process: str = "api") -> None:
    """JSON lines on stderr; ``process`` (api or engine) is a field of every line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_Tag(process))
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # no caller's file and line (documented: logging "Optimization")
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("transformers.modeling_rope_utils").addFilter(_KnownRopeKeys())
    # uvicorn's own access log would duplicate ours (which has request ids and route templates).
    logging.getLogger("uvicorn.access").disabled = True
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def route_library_logs() -> None:
    """transformers and torch log through stderr handlers of their own, in their own formats
    (torch's like glog's: inductor's and dynamo's warnings), and transformers draws tqdm bars:
    their records go through ours instead, one JSON line each. Call it where the model is
    loaded (it imports torch, whose import attaches the handlers)."""
    import torch  # noqa: F401
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    for name, found in list(logging.Logger.manager.loggerDict.items()):
        if not name.startswith("torch") or not isinstance(found, logging.Logger):
            continue
        # Only the plain stderr handlers torch._logging attached (its trace artifacts' handler
        # stays where it writes).
        printing = [h for h in found.handlers if type(h) is logging.StreamHandler]
        for handler in printing:
            found.removeHandler(handler)
        if printing:
            found.propagate = True
