"""Log lines are JSON with an unambiguous timestamp (UTC, milliseconds) and the extra fields."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

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


# What the engine process does before it loads a model (``factory.load_engine``), then what
# torch's compilers and transformers log while it does: inductor's warnings reached the log as
# glog-like text lines before (docs/benchmarks.md, run 101).
_ENGINE_PROCESS = """
import logging
from service.logs import configure_logging, route_library_logs
configure_logging("info", process="engine")
route_library_logs()
import torch
logging.getLogger("torch._inductor.select_algorithm").warning("inductor says")
logging.getLogger("torch._dynamo.convert_frame").warning("dynamo says")
logging.getLogger("torch").warning("torch says")
logging.getLogger("transformers.modeling_utils").warning("transformers says")
"""


def test_torch_and_transformers_log_into_the_engine_s_json_lines() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE_PROCESS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON record
    said = {record["message"]: record["logger"] for record in records}
    for library in ("inductor", "dynamo", "torch", "transformers"):
        assert f"{library} says" in said
    assert said["inductor says"] == "torch._inductor.select_algorithm"
