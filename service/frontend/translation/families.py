"""The Hunyuan translation model families as data: their prompt templates, how glossary terms
are written, which translation options each supports, and their generation defaults.

Every template is Tencent's published text (Hunyuan-MT-7B's model card, the HY-MT1.5 README, the
Hy-MT2 README table with ``<br>`` read as a newline; docs/model-families.md has the sources and
the readings). Placeholders are filled in one pass (``fill``), so braces or placeholder names
inside a user's text stay plain data, and literal braces in a template stay as printed.

A template exists per instruction language: ``zh`` is used when either side of the pair is
Chinese (or when the family has only a Chinese version of that template), ``en`` otherwise, and
the language names follow the template's language (Chinese names in Chinese prompts).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from service.config.kinds import FamilyName

# The translation options of the native API, by the template they need.
Option = Literal["glossary", "context", "format", "style", "preferences", "delimiter"]
# Template kinds besides "default" and the options: how each ``format`` value is rendered.
STRUCTURED_FORMATS: Mapping[str, str] = {
    "json": "JSON",
    "html": "HTML",
    "csv": "CSV",
    "markdown": "Markdown",
}

# Hunyuan-MT-7B's model card.
_HUNYUAN_ZH = "把下面的文本翻译成{target}，不要额外解释。\n\n{text}"
_HUNYUAN_EN = (
    "Translate the following segment into {target}, without additional explanation.\n\n{text}"
)
# The HY-MT1.5 README's code blocks (no trailing spaces).
_HY15_ZH = "将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"
_HY15_GLOSSARY = (
    "参考下面的翻译：\n{terms}\n\n"
    "将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n{text}"
)
# One empty line after the text in the README's block: the template ends with a newline.
_HY15_CONTEXT = (
    "{context}\n"
    "参考上面的信息，把下面的文本翻译成{target}，注意不需要翻译上文，也不要额外解释：\n{text}\n"
)
# The target language is hard-coded as Chinese in Tencent's template.
_HY15_FORMAT = (
    "将以下<source></source>之间的文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释，"
    "原文中的<sn></sn>标签表示标签内文本包含格式信息，需要在译文中相应的位置尽量保留该标签。"
    "输出格式为：<target>str</target>\n\n<source>{text}</source>"
)
# The Hy-MT2 README's table.
_HY2_EN = (
    "Translate the following text into {target}. Note that you should only output the translated "
    "result without any additional explanation:\n\n{text}"
)
_HY2_GLOSSARY_ZH = (
    "参考下面的翻译：\n{terms}\n"
    "将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}"
)
_HY2_GLOSSARY_EN = (
    "Reference the following translations:\n{terms}\n\nTranslate the following text into "
    "{target}. Note that you must ONLY output the translated result without any additional "
    "explanation:\n\n{text}"
)
_HY2_STYLE_ZH = "请将以下文本翻译为{target}。\n注意翻译的风格要严格符合【{style}】\n\n{text}"
_HY2_STYLE_EN = (
    "Please translate the following text into {target}. Note that the translation style must "
    "strictly conform to [{style}]:\n\n{text}"
)
# ``{preferences}``: the numbered preferences and the last item's number (``numbered``).
_HY2_PREFERENCES_ZH = (
    "【待翻译文本】\n{text}\n\n【翻译任务】\n{preferences}将【待翻译文本】翻译为{target}。"
)
_HY2_PREFERENCES_EN = (
    "[Source Text]\n{text}\n\n[Translation Tasks]\n{preferences}Translate the [Source Text] into "
    "{target}."
)
_HY2_CONTEXT_ZH = (
    "【背景信息】\n{context}\n\n请结合背景信息将以下文本翻译为{target}。\n\n【待翻译文本】\n{text}"
)
_HY2_CONTEXT_EN = (
    "[Background Information]\n{context}\n\nPlease translate the following text into {target}, "
    "taking the provided background information into consideration.\n\n[Source Text]\n{text}"
)

# Delimiter-safe translation: the delimiters themselves are not named in the template.
_HY2_DELIMITER_ZH = (
    "请将以下文本准确翻译为{target}。\n"
    "你必须在译文中保留等量的分隔符，绝对不可遗漏、转义或翻译该符号，并注意分隔符的位置。\n\n{text}"
)
_HY2_DELIMITER_EN = (
    "Please accurately translate the following text into {target}.\nYou must retain the exact "
    "same number of delimiters in the translation. Strictly do not omit, escape, or translate "
    "these symbols, and pay close attention to their placement.\n\n{text}"
)
# Structured data (JSON, HTML, CSV, Markdown). The Chinese version names the data placeholder in
# its first line too, so the data appears twice there, as published; ``{{var}}`` is printed
# literally (docs/model-families.md).
_HY2_STRUCTURED_ZH = (
    "# 任务目标\n将下方{text}中的{format_type}格式数据翻译为{target}。\n\n# 严格约束\n"
    "1. **结构锁定**：绝对保持原有的{format_type}数据结构、缩进和层级完全不变。\n"
    "2. **选择性翻译**：仅翻译面向用户展示的可见文本内容。\n"
    "3. **禁止修改**：**严禁**翻译或更改任何代码标签、键名 (Key)、变量占位符"
    "（如 `{{var}}`、`${var}`、`%s`、`%d` 等）或代码属性。\n\n# 数据输入\n{text}"
)
_HY2_STRUCTURED_EN = (
    "### Task\nTranslate the user-facing text within the following {format_type} data into "
    "{target}.\n\n### Strict Rules\n1. **Structure Preservation:** You MUST preserve the "
    "original {format_type} data structure, nesting, hierarchy, and indentation exactly as they "
    "are.\n2. **Selective Translation:** Translate ONLY the visible, user-facing text "
    "content/values.\n3. **Strict Non-Translation:** NEVER translate or alter code tags, keys, "
    "properties, object names, or variable placeholders. Leave them exactly in their original "
    "English/code form.\n\n### Source Data\n{text}"
)

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# ``markup``: numbered tags (HY-MT1.5); ``structured``: one of ``STRUCTURED_FORMATS`` (Hy-MT2).
_FORMAT_KINDS = frozenset({"markup", "structured"})


@dataclass(frozen=True, slots=True)
class Family:
    """One model family: its templates by kind and instruction language, and its defaults."""

    name: FamilyName
    title: str
    # (kind, instruction language) -> template; kind "default" or an ``Option``.
    templates: Mapping[tuple[str, str], str]
    # One glossary line per term, by instruction language.
    term_lines: Mapping[str, str] = field(default_factory=dict)
    licence: str = ""
    # Bumped whenever a template changes: part of every cache key.
    version: int = 1

    @property
    def options(self) -> frozenset[str]:
        """The native API's options the templates support (both format kinds are ``format``)."""
        kinds = {kind for kind, _ in self.templates if kind != "default"}
        return frozenset("format" if kind in _FORMAT_KINDS else kind for kind in kinds)

    @property
    def formats(self) -> frozenset[str]:
        """The ``format`` values besides ``text`` the templates support."""
        kinds = {kind for kind, _ in self.templates}
        found = {"markup"} if "markup" in kinds else set()
        if "structured" in kinds:
            found.update(STRUCTURED_FORMATS)
        return frozenset(found)

    @property
    def cache_name(self) -> str:
        return f"{self.name}-v{self.version}"

    def template(self, kind: str, chinese: bool) -> tuple[str, str]:
        """The template of ``kind`` and its instruction language for a pair that involves
        Chinese or not (a kind with only a Chinese version always takes that one)."""
        language = "zh" if chinese or (kind, "en") not in self.templates else "en"
        return self.templates[(kind, language)], language


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with the placeholders named in ``values`` replaced in one pass: nothing
    inserted is read again, and any other brace stays as written."""
    return _PLACEHOLDER.sub(lambda match: values.get(match.group(1), match.group(0)), template)


def numbered(items: list[str], language: str) -> str:
    """Preference lines numbered from 1, then the number of the last item, which is the
    template's translate instruction: ``1、a\n2、b\n3、`` (``1. a\n2. b\n3. `` in English)."""
    mark = "、" if language == "zh" else ". "
    lines = [f"{n}{mark}{item}\n" for n, item in enumerate(items, start=1)]
    return "".join(lines) + f"{len(items) + 1}{mark}"


HUNYUAN_MT = Family(
    name="hunyuan-mt",
    title="Hunyuan-MT-7B",
    templates={("default", "zh"): _HUNYUAN_ZH, ("default", "en"): _HUNYUAN_EN},
    licence="Tencent Hunyuan Community License; does not apply in the European Union, the United "
    "Kingdom and South Korea",
)
HY_MT15 = Family(
    name="hy-mt1.5",
    title="HY-MT1.5",
    templates={
        ("default", "zh"): _HY15_ZH,
        ("default", "en"): _HUNYUAN_EN,
        ("glossary", "zh"): _HY15_GLOSSARY,
        ("context", "zh"): _HY15_CONTEXT,
        ("markup", "zh"): _HY15_FORMAT,
    },
    # The README shows one term; several are written one per line, as Hy-MT2's README does.
    term_lines={"zh": "{source} 翻译成 {target}"},
    licence="Tencent HY Community License; does not apply in the European Union, the United "
    "Kingdom and South Korea",
)
HY_MT2 = Family(
    name="hy-mt2",
    title="Hy-MT2",
    templates={
        ("default", "zh"): _HY15_ZH,
        ("default", "en"): _HY2_EN,
        ("glossary", "zh"): _HY2_GLOSSARY_ZH,
        ("glossary", "en"): _HY2_GLOSSARY_EN,
        ("style", "zh"): _HY2_STYLE_ZH,
        ("style", "en"): _HY2_STYLE_EN,
        ("preferences", "zh"): _HY2_PREFERENCES_ZH,
        ("preferences", "en"): _HY2_PREFERENCES_EN,
        ("context", "zh"): _HY2_CONTEXT_ZH,
        ("context", "en"): _HY2_CONTEXT_EN,
        ("delimiter", "zh"): _HY2_DELIMITER_ZH,
        ("delimiter", "en"): _HY2_DELIMITER_EN,
        ("structured", "zh"): _HY2_STRUCTURED_ZH,
        ("structured", "en"): _HY2_STRUCTURED_EN,
    },
    term_lines={"zh": "{source} 翻译成 {target}", "en": "{source} translates to {target}"},
    licence="Apache License 2.0 (since 2026-05-26; the Tencent HY Community License before)",
)
FAMILIES: Mapping[str, Family] = {f.name: f for f in (HUNYUAN_MT, HY_MT15, HY_MT2)}
