"""Source-language detection, per text, restricted to the languages the model translates.

Three signals, strongest first:

- **Script.** Letters in a script only one of the model's languages is written in (Hangul,
  Thai, Hebrew, Tamil...) decide alone, and kana means Japanese. Otherwise the candidates are the
  languages written in the text's main script: a Latin-script word is never Arabic, whatever a
  character model makes of five letters.
- **py3langid** (a maintained fork of langid.py) over those candidates. Chosen over lingua
  (as accurate, much slower and larger) and langdetect (less accurate, randomised unless
  seeded): a small model inside the package, deterministic. It knows 37 of the 38 languages;
  Tibetan script is reported by it as Dzongkha.
- **Word frequencies** (wordfreq's small lists, 42 languages) for short texts, up to
  ``_SHORT_WORDS`` words, where a character model has too little to go on ("Hello" came out
  Italian, "World" Arabic): each word's frequency in each candidate language, as in a
  naive Bayes over words, multiplied into py3langid's probabilities.

``confidence`` is the winner's share of the combined probability over the candidates; below
``UNCERTAIN_BELOW`` the source language is reported as uncertain. docs/benchmarks.md has the
measured accuracy (``python -m loadtests.detection``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

import wordfreq
from py3langid.langid import MODEL_FILE, LanguageIdentifier

from service.frontend.translation.languages import Language, LanguageTable

# Below this confidence a detected source language is reported as uncertain.
UNCERTAIN_BELOW = 0.5
# A translation is said to be in another language than its target only when the detector is at
# least this sure and the text has at least this many letters: short texts and names fool it.
MISMATCH_FROM = 0.8
MISMATCH_LETTERS = 12
# Targets whose output the detector cannot tell apart (Chinese scripts and Cantonese; Malay and
# Indonesian): no mismatch between them.
_ALIKE = (frozenset({"zh", "zh-Hant", "yue"}), frozenset({"ms", "id"}))
# Texts of at most this many words also get the word-frequency signal.
_SHORT_WORDS = 3
# The Zipf value (log10 of occurrences per billion words) a word gets in a language that does
# not list it, and in a language without a list: rare, not impossible.
_UNLISTED_ZIPF = 1.0
_NO_LIST_ZIPF = 2.0
# py3langid code -> the model card's code, where they differ.
_ALIASES = {"dz": "bo"}
# The model card's code -> wordfreq's, where they differ.
_WORDFREQ = {"tl": "fil", "zh-Hant": "zh"}
# The script each of the model's languages is written in (first word of the Unicode names of
# its letters); Japanese is found by its kana.
_SCRIPTS = {
    "LATIN": ("en", "fr", "pt", "es", "tr", "it", "de", "vi", "ms", "id", "tl", "pl", "cs", "nl"),
    "CYRILLIC": ("ru", "uk", "kk", "mn"),
    "ARABIC": ("ar", "fa", "ur", "ug"),
    "DEVANAGARI": ("hi", "mr"),
    "CJK": ("zh", "yue", "ja"),
    "HANGUL": ("ko",),
    "THAI": ("th",),
    "KHMER": ("km",),
    "MYANMAR": ("my",),
    "TIBETAN": ("bo",),
    "GUJARATI": ("gu",),
    "TELUGU": ("te",),
    "TAMIL": ("ta",),
    "BENGALI": ("bn",),
    "HEBREW": ("he",),
    "MONGOLIAN": ("mn",),
}
_KANA = ("HIRAGANA", "KATAKANA")
# Characters written in Cantonese and not in Mandarin.
_CANTONESE = frozenset("嘅咗唔係冇啲佢喺嚟咁噉乜嘢")
_WORDS = re.compile(r"\w+(?:['’-]\w+)*")


@dataclass(frozen=True, slots=True)
class Detection:
    language: Language
    confidence: float

    @property
    def uncertain(self) -> bool:
        return self.confidence < UNCERTAIN_BELOW


def letters(text: str) -> int:
    return sum(1 for char in text if char.isalpha())


def target_mismatch(text: str, target: Language, detection: Detection) -> bool:
    """Whether a translation is surely not in its target language (HY-MT1.5 users report
    EN->JA answered in Hindi): detected with confidence, long enough, and not a language the
    detector confuses with the target."""
    if detection.confidence < MISMATCH_FROM:
        return False
    if letters(text) < MISMATCH_LETTERS:
        return False
    found, wanted = detection.language.code, target.code
    return found != wanted and not any({found, wanted} <= alike for alike in _ALIKE)


class LanguageDetector:
    """Detects which supported language a text is in. Loading takes about a second (py3langid's
    model and the word lists of the languages that need them)."""

    def __init__(self, languages: LanguageTable) -> None:
        self._languages = languages
        self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self._identifier.nb_classes)
        wanted = {code.split("-")[0] for code in languages} | set(_ALIASES)
        self._identifier.set_languages(sorted(wanted & known))
        listed = set(wordfreq.available_languages(wordlist="small"))
        self._lists: dict[str, dict[str, float]] = {}
        # Only where the script leaves a choice, and not for Han (decided by characters).
        for script, codes in _SCRIPTS.items():
            if len(codes) == 1 or script == "CJK":
                continue
            for code in codes:
                name = _WORDFREQ.get(code, code)
                if name in listed and code in languages:
                    self._lists[code] = wordfreq.get_frequency_dict(name, wordlist="small")

    def detect(self, text: str) -> Detection:
        candidates = self._candidates(text)
        if len(candidates) == 1:
            return Detection(self._languages[candidates[0]], 1.0)
        if candidates[0] == "zh":  # Han characters without kana
            code = "yue" if _CANTONESE.intersection(text) else "zh"
            return Detection(self._languages[code], 1.0 if code == "yue" else 0.9)
        scores = self._character_model(text, candidates)
        words = [word.lower() for word in _WORDS.findall(text)]
        if 0 < len(words) <= _SHORT_WORDS:
            for code in candidates:
                scores[code] *= 10.0 ** self._zipf(words, code)
        total = sum(scores.values())
        if total <= 0 or not math.isfinite(total):
            return Detection(self._languages[candidates[0]], 0.0)
        best = max(candidates, key=lambda code: scores[code])
        return Detection(self._languages[best], round(scores[best] / total, 4))

    def _candidates(self, text: str) -> tuple[str, ...]:
        """The languages the text's main script allows (all for a text without letters)."""
        counts: dict[str, int] = {}
        for char in text:
            if not char.isalpha():
                continue
            script = unicodedata.name(char, "").split(" ")[0]
            if script in _KANA:
                return ("ja",)
            counts[script] = counts.get(script, 0) + 1
        for script in sorted(counts, key=counts.__getitem__, reverse=True):
            codes = tuple(code for code in _SCRIPTS.get(script, ()) if code in self._languages)
            if codes:
                return codes
        return tuple(code for code in self._languages if code != "zh-Hant")

    def _character_model(self, text: str, candidates: tuple[str, ...]) -> dict[str, float]:
        """py3langid's probabilities, renormalised over ``candidates``."""
        ranked = {_ALIASES.get(code, code): float(p) for code, p in self._identifier.rank(text)}
        scores = {code: ranked.get(code, 0.0) for code in candidates}
        total = sum(scores.values())
        if total <= 0:
            return dict.fromkeys(candidates, 1.0 / len(candidates))
        return {code: score / total for code, score in scores.items()}

    def _zipf(self, words: list[str], code: str) -> float:
        """The sum over ``words`` of their Zipf frequency in language ``code``."""
        frequencies = self._lists.get(code)
        if frequencies is None:
            return _NO_LIST_ZIPF * len(words)
        total = 0.0
        for word in words:
            frequency = frequencies.get(word, 0.0)
            zipf = math.log10(frequency * 1e9) if frequency > 0 else 0.0
            total += max(zipf, _UNLISTED_ZIPF)
        return total
