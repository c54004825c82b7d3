"""Rooms small enough to read in one sitting: no source file under ``service/`` over 600 lines,
no function over 80, no settings class with more than 25 fields. Triton kernels are excepted:
a kernel is one function the compiler sees whole."""

from __future__ import annotations

import ast
from pathlib import Path

from pydantic import BaseModel

from service.config.settings import Settings

SERVICE = Path(__file__).resolve().parents[1] / "service"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_SETTINGS_FIELDS = 25


def _sources() -> list[Path]:
    return sorted(path for path in SERVICE.rglob("*.py") if not path.name.endswith("_kernel.py"))


def test_no_source_file_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(SERVICE)): lines
        for path in _sources()
        if (lines := path.read_text().count("\n")) > MAX_FILE_LINES
    }
    assert not long


def test_no_function_is_over_80_lines() -> None:
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(SERVICE)}:{node.lineno} {node.name}"] = lines
    assert not long


def test_no_settings_class_has_more_than_25_fields() -> None:
    sections: list[type[BaseModel]] = [Settings, *Settings.SECTIONS.values()]
    crowded = {
        section.__name__: len(section.model_fields)
        for section in sections
        if len(section.model_fields) > MAX_SETTINGS_FIELDS
    }
    assert not crowded
