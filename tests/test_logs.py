"""Log lines are JSON with an unambiguous timestamp (UTC, milliseconds) and the extra fields."""

from __future__ import annotations

import json
import logging
import re

from service.logs import JsonFormatter


def test_a_line_is_json_with_a_utc_millisecond_timestamp() -> None:
    record = logging.LogRecord("service.x", logging.INFO, "", 0, "hello %s", ("there",), None)
    record.created = 1_796_166_575.0429  # 2026-12-01T23:09:35.042Z
    record.request_id = "abc"
    line = json.loads(JsonFormatter().format(record))
    assert line["time"] == "2026-12-01T23:09:35.042Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
    assert (line["level"], line["logger"], line["message"]) == ("info", "service.x", "hello there")
    assert line["request_id"] == "abc"
