"""The languages Hunyuan-MT supports: the 38 rows of the model card, with both names.

The English name goes into the English prompt template, the Chinese name into the Chinese one.
Codes are matched case-insensitively (``ZH-hant`` finds ``zh-Hant``), and the spellings clients
send for the same languages resolve to them (``resolve``): BCP 47 tags with a region or script
(``en-US``, ``pt-BR``, ``zh-CN``, ``zh-Hans``, ``zh-TW``), the codes of LibreTranslate (``zt``,
``pb``) and of older ISO 639 (``iw``, ``in``, ``fil``), and the languages' names (``english``,
``英语``). An unknown code is refused with the closest codes as suggestions.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from service.contract.errors import UnknownLanguage


@dataclass(frozen=True, slots=True)
class Language:
    code: str
    english_name: str
    chinese_name: str

    @property
    def is_chinese(self) -> bool:
        """Whether prompts involving this language use the Chinese template."""
        return self.code in _CHINESE_CODES


# Written Chinese in either script, and Cantonese, select the Chinese template ("ZH<=>XX").
_CHINESE_CODES = frozenset({"zh", "zh-Hant", "yue"})

_ROWS: tuple[tuple[str, str, str], ...] = (
    ("zh", "Chinese", "中文"),
    ("en", "English", "英语"),
    ("fr", "French", "法语"),
    ("pt", "Portuguese", "葡萄牙语"),
    ("es", "Spanish", "西班牙语"),
    ("ja", "Japanese", "日语"),
    ("tr", "Turkish", "土耳其语"),
    ("ru", "Russian", "俄语"),
    ("ar", "Arabic", "阿拉伯语"),
    ("ko", "Korean", "韩语"),
    ("th", "Thai", "泰语"),
    ("it", "Italian", "意大利语"),
    ("de", "German", "德语"),
    ("vi", "Vietnamese", "越南语"),
    ("ms", "Malay", "马来语"),
    ("id", "Indonesian", "印尼语"),
    ("tl", "Filipino", "菲律宾语"),
    ("hi", "Hindi", "印地语"),
    ("zh-Hant", "Traditional Chinese", "繁体中文"),
    ("pl", "Polish", "波兰语"),
    ("cs", "Czech", "捷克语"),
    ("nl", "Dutch", "荷兰语"),
    ("km", "Khmer", "高棉语"),
    ("my", "Burmese", "缅甸语"),
    ("fa", "Persian", "波斯语"),
    ("gu", "Gujarati", "古吉拉特语"),
    ("ur", "Urdu", "乌尔都语"),
    ("te", "Telugu", "泰卢固语"),
    ("mr", "Marathi", "马拉地语"),
    ("he", "Hebrew", "希伯来语"),
    ("bn", "Bengali", "孟加拉语"),
    ("ta", "Tamil", "泰米尔语"),
    ("uk", "Ukrainian", "乌克兰语"),
    ("bo", "Tibetan", "藏语"),
    ("kk", "Kazakh", "哈萨克语"),
    ("mn", "Mongolian", "蒙古语"),
    ("ug", "Uyghur", "维吾尔语"),
    ("yue", "Cantonese", "粤语"),
)


# Other spellings of a code in the table, lower case.
_ALIASES = {
    "zh-hans": "zh",
    "zh-cn": "zh",
    "zh-sg": "zh",
    "zh-my": "zh",
    "zh-hant": "zh-Hant",
    "zh-tw": "zh-Hant",
    "zh-hk": "zh-Hant",
    "zh-mo": "zh-Hant",
    "zt": "zh-Hant",  # LibreTranslate
    "pb": "pt",  # LibreTranslate
    "fil": "tl",
    "iw": "he",
    "in": "id",
    "zh-yue": "yue",
}
# A Chinese tag with one of these subtags is written in traditional characters.
_TRADITIONAL = frozenset({"hant", "tw", "hk", "mo"})


class LanguageTable(Mapping[str, Language]):
    """Read-only lookup of supported languages by case-insensitive code."""

    def __init__(self, rows: tuple[tuple[str, str, str], ...] = _ROWS) -> None:
        self._by_code = {code.lower(): Language(code, en, zh) for code, en, zh in rows}
        self._by_name: dict[str, Language] = {}
        for language in self._by_code.values():
            self._by_name[language.english_name.lower()] = language
            self._by_name[language.chinese_name] = language

    def lookup(self, code: str) -> Language | None:
        """The language ``code`` means, in any of the spellings the module accepts, or None."""
        key = code.strip().lower().replace("_", "-")
        found = self._by_code.get(key) or self._by_name.get(key)
        if found is not None:
            return found
        alias = _ALIASES.get(key)
        if alias is not None:
            return self._by_code.get(alias.lower())
        base, _, rest = key.partition("-")
        if not rest or not base.isalpha():
            return None
        if base == "zh" and _TRADITIONAL.intersection(rest.split("-")):
            return self._by_code.get("zh-hant")
        return self._by_code.get(base)  # a region or script of a language we have: en-US

    def __getitem__(self, code: str) -> Language:
        return self._by_code[code.lower()]

    def __iter__(self) -> Iterator[str]:
        return (language.code for language in self._by_code.values())

    def __len__(self) -> int:
        return len(self._by_code)

    def resolve(self, code: str, *, field: str) -> Language:
        """The language for ``code``, or ``UnknownLanguage`` naming the request field and the
        closest codes."""
        found = self.lookup(code)
        if found is not None:
            return found
        suggestions = self.suggest(code)
        hint = f" (did you mean {' or '.join(map(repr, suggestions))}?)" if suggestions else ""
        raise UnknownLanguage(
            f"{field}: unsupported language code {code!r}{hint}; GET /languages lists the codes"
        )

    def suggest(self, code: str) -> list[str]:
        """Up to three codes close to ``code`` (by code or by name)."""
        key = code.strip().lower()[:64]
        candidates = {key: language.code for key, language in self._by_code.items()}
        candidates.update({name: language.code for name, language in self._by_name.items()})
        close = difflib.get_close_matches(key, list(candidates), n=6, cutoff=0.6)
        codes: list[str] = []
        for match in close:
            if candidates[match] not in codes:
                codes.append(candidates[match])
        return codes[:3]
