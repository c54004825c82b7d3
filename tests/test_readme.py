"""The README and the docs stay true: the two commands, the length a newcomer reads, the
configuration reference written from the settings, and links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

from service.config.reference import render

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text("utf-8")


def test_readme_opens_with_the_run_and_test_commands() -> None:
    opening = README.split("```")[1]
    commands = [line.split("#")[0].strip() for line in opening.splitlines() if line.strip()]
    assert commands[1:] == ["make run", "make test"]
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    assert "make test" in ci


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 200


def test_the_configuration_reference_is_written_from_the_settings() -> None:
    written = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    assert written == render(), "run: python -m service.config.reference > docs/configuration.md"


def test_every_link_to_a_file_of_the_repository_leads_to_one() -> None:
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for document in documents:
        text = document.read_text("utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (document.parent / target).exists():
                broken.append(f"{document.name}: {target}")
    assert broken == []
