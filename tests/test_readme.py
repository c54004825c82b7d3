"""The README stays true: its two commands and its configuration table."""

from __future__ import annotations

from pathlib import Path

from service.config import Settings

README = (Path(__file__).parent.parent / "README.md").read_text("utf-8")


def test_every_setting_is_documented() -> None:
    missing = [name for name in Settings.model_fields if f"`HYMT_{name.upper()}`" not in README]
    assert missing == []


def test_readme_opens_with_the_run_and_test_commands() -> None:
    opening = README.split("```")[1]
    commands = [line.split("#")[0].strip() for line in opening.splitlines() if line.strip()]
    assert commands[1:] == ["make run", "make test"]
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text("utf-8")
    assert "make test" in ci
