"""The Hunyuan-MT prompt templates, exactly as the model card gives them.

The Chinese template is used when either side of the pair is Chinese, the English one otherwise;
the target language is named in the template's own language. The chat template around the prompt
is the tokenizer's business (``service.engine.tokenization``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from service.translation.languages import Language

CHINESE_TEMPLATE = "把下面的文本翻译成{target_language}，不要额外解释。\n\n{source_text}"
ENGLISH_TEMPLATE = (
    "Translate the following segment into {target_language}, without additional explanation."
    "\n\n{source_text}"
)


@dataclass(frozen=True, slots=True)
class PromptFormat:
    """Renders the translation instruction for one text.

    ``name`` identifies the template family in cache keys: change it whenever a template changes.
    """

    name: str = "hunyuan-mt-v1"
    chinese_template: str = CHINESE_TEMPLATE
    english_template: str = ENGLISH_TEMPLATE

    def render(self, text: str, target: Language, source: Language | None) -> str:
        """The user message asking to translate ``text`` into ``target``.

        ``str.format`` substitutes the text once and never re-parses it, so braces or template
        words inside the text stay plain data.
        """
        if target.is_chinese or (source.is_chinese if source else looks_chinese(text)):
            return self.chinese_template.format(
                target_language=target.chinese_name, source_text=text
            )
        return self.english_template.format(target_language=target.english_name, source_text=text)


def looks_chinese(text: str) -> bool:
    """Whether an unlabelled text is Chinese, judged by its script.

    Han ideographs with no kana or hangul: Japanese and Korean also use Han characters, but
    always beside their own scripts. Used only to choose the template when no source is given.
    """
    han = 0
    for char in text:
        name = unicodedata.name(char, "")
        if name.startswith(("HIRAGANA", "KATAKANA", "HANGUL")):
            return False
        if name.startswith("CJK UNIFIED IDEOGRAPH"):
            han += 1
    letters = sum(1 for char in text if char.isalpha())
    return letters > 0 and han * 2 >= letters
