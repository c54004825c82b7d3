"""The multilingual sentences shipped with the package (``service/engine/corpus/``): the demo
tokenizer trains on them and the load generator builds its texts from them. Kept apart from
``demo`` so that reading them does not import torch and transformers (the load generator's
spawned client processes import this)."""

from __future__ import annotations

from importlib import resources


def corpus_texts() -> list[str]:
    """The sentences, one per line, all languages."""
    lines: list[str] = []
    folder = resources.files("service.engine").joinpath("corpus")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".txt"):
            lines.extend(line for line in entry.read_text("utf-8").splitlines() if line.strip())
    return lines
