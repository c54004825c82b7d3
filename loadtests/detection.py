"""Accuracy of source-language detection: the service's detector against py3langid alone.

Three sets: the short texts of ``loadtests/data/short-texts.tsv`` (single words and two-word
phrases in 20 languages), and the shipped corpus (``service/engine/corpus``: its sentences, and
their first three words). Prints a JSON report: accuracy per set and per language, the texts
missed, how many answers were flagged uncertain, and the time per text.

    python -m loadtests.detection
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from py3langid.langid import MODEL_FILE, LanguageIdentifier

from service.frontend.translation.detection import LanguageDetector
from service.frontend.translation.languages import LanguageTable

SHORT_TEXTS = Path(__file__).parent / "data" / "short-texts.tsv"
CORPUS = Path(__file__).parents[1] / "service" / "engine" / "corpus"

Sample = tuple[str, str]  # (language, text)
Detect = Callable[[str], tuple[str, bool]]  # text -> (language, uncertain)


def short_texts(path: Path = SHORT_TEXTS) -> list[Sample]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            language, text = line.split("\t", 1)
            rows.append((language, text))
    return rows


def corpus(fragment_words: int | None = None) -> list[Sample]:
    """The corpus sentences, or their first ``fragment_words`` words."""
    rows = []
    for file in sorted(CORPUS.glob("*.txt")):
        for line in file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                text = line if fragment_words is None else " ".join(line.split()[:fragment_words])
                rows.append((file.stem, text))
    return rows


def plain_py3langid(languages: LanguageTable) -> Detect:
    """py3langid alone over the model's languages: what the service used before."""
    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    wanted = {code.split("-")[0] for code in languages} | {"dz"}
    identifier.set_languages(sorted(wanted & set(identifier.nb_classes)))

    def detect(text: str) -> tuple[str, bool]:
        code, _ = identifier.classify(text)
        return {"dz": "bo"}.get(code, code), False

    return detect


def service_detector(languages: LanguageTable) -> Detect:
    detector = LanguageDetector(languages)

    def detect(text: str) -> tuple[str, bool]:
        found = detector.detect(text)
        return found.language.code, found.uncertain

    return detect


def evaluate(detect: Detect, samples: Sequence[Sample]) -> dict[str, object]:
    right: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    missed: list[str] = []
    uncertain = 0
    started = time.perf_counter()
    for language, text in samples:
        found, unsure = detect(text)
        seen[language] += 1
        uncertain += unsure
        if found == language:
            right[language] += 1
        else:
            missed.append(f"{language}:{text} -> {found}{' (uncertain)' if unsure else ''}")
    elapsed = time.perf_counter() - started
    return {
        "right": sum(right.values()),
        "of": len(samples),
        "accuracy": round(sum(right.values()) / max(len(samples), 1), 4),
        "by_language": {language: f"{right[language]}/{seen[language]}" for language in seen},
        "uncertain": uncertain,
        "ms_per_text": round(1000 * elapsed / max(len(samples), 1), 3),
        "missed": missed,
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    argparse.ArgumentParser(prog="python -m loadtests.detection", description=__doc__).parse_args(
        argv
    )
    languages = LanguageTable()
    sets = {
        "short_texts": short_texts(),
        "corpus_sentences": corpus(),
        "corpus_three_words": corpus(fragment_words=3),
    }
    report: dict[str, object] = {}
    for name, make in (("py3langid", plain_py3langid), ("service", service_detector)):
        detect = make(languages)
        report[name] = {set_name: evaluate(detect, samples) for set_name, samples in sets.items()}
    print(json.dumps(report, ensure_ascii=False, indent=2))
    return report


if __name__ == "__main__":
    main()
