"""Translation-shaped texts for load: 1-4 sentences of the shipped multilingual corpus.

Each text is distinct (a running tag) so the result cache and in-flight sharing never turn the
load into lookups; lengths vary the way real traffic does, from a short line to a paragraph.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from service.engine.corpus import corpus_texts

# Target languages for the English template; Chinese-source texts use the Chinese one.
TARGETS = ("de", "fr", "es", "ja", "zh", "en", "ko", "ru")


@dataclass(frozen=True, slots=True)
class Job:
    texts: tuple[str, ...]
    target_lang: str


def make_jobs(count: int, *, batch_size: int = 1, seed: int = 0) -> list[Job]:
    """``count`` jobs of ``batch_size`` texts each, deterministic for a seed."""
    sentences = corpus_texts()
    rng = random.Random(seed)
    jobs: list[Job] = []
    serial = 0
    for _ in range(count):
        texts = []
        for _ in range(batch_size):
            serial += 1
            picked = rng.sample(sentences, k=rng.choice((1, 1, 2, 2, 3, 4)))
            texts.append(f"{' '.join(picked)} ({serial})")
        jobs.append(Job(tuple(texts), rng.choice(TARGETS)))
    return jobs
