"""Language names as written in another language (Google's ``/languages?target=``): the table's
own English and Chinese names, and for the other languages CLDR's names by way of ``langcodes``
(``language-data`` holds them)."""

from __future__ import annotations

import functools

import langcodes

from service.frontend.translation.languages import Language


@functools.lru_cache(maxsize=4096)
def _cldr_name(code: str, display: str) -> str:
    return str(langcodes.Language.get(code).display_name(display))


def language_name(language: Language, display: Language) -> str:
    """``language``'s name in ``display``'s language."""
    if display.code == "en":
        return language.english_name
    if display.code == "zh":
        return language.chinese_name
    try:
        return _cldr_name(language.code, display.code)
    except (LookupError, ValueError, ImportError):  # no language-data: the English name
        return language.english_name
