"""Every template of every family, byte for byte as Tencent publishes it (docs/model-families.md),
filled with several glossary terms, context, nested markup, a style and preferences; and which
model a name or setting resolves to."""

from __future__ import annotations

import pytest

from service.config.models import resolve_model
from service.contract.errors import Unsupported
from service.frontend.translation.families import HUNYUAN_MT, HY_MT2, HY_MT15
from service.frontend.translation.languages import LanguageTable
from service.frontend.translation.prompts import PromptFormat, TranslationOptions
from service.frontend.translation.tags import number_tags
from service.frontend.translation.thinking import ThoughtFilter, without_thoughts

LANGS = LanguageTable()
EN, ZH, DE, FR = LANGS["en"], LANGS["zh"], LANGS["de"], LANGS["fr"]
HY15 = PromptFormat(HY_MT15)
HY2 = PromptFormat(HY_MT2)
TERMS = TranslationOptions(glossary=(("Cloud Native", "云原生"), ("Load Balancer", "负载均衡器")))


def test_hy_mt15_default_templates() -> None:
    assert HY15.render("Hello", ZH, EN) == (
        "将以下文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释：\n\nHello"
    )
    assert HY15.render("Bonjour", DE, FR) == (
        "Translate the following segment into German, without additional explanation.\n\nBonjour"
    )


def test_hy_mt15_terminology_with_several_terms() -> None:
    # Chinese only in Tencent's README: used for every pair, one term per line.
    text = "Deploy the Cloud Native load balancer."
    assert HY15.render(text, DE, EN, TERMS) == (
        "参考下面的翻译：\n"
        "Cloud Native 翻译成 云原生\n"
        "Load Balancer 翻译成 负载均衡器\n"
        "\n"
        "将以下文本翻译为德语，注意只需要输出翻译后的结果，不要额外解释：\n"
        f"{text}"
    )


def test_only_the_glossary_terms_in_the_text_reach_its_prompt() -> None:
    """A stored glossary of thousands of terms must not fill every prompt."""
    many = TranslationOptions(glossary=tuple((f"term{n}", f"T{n}") for n in range(40_000)))
    prompt = HY15.render("Use TERM7 here.", DE, EN, many)
    assert "term7 翻译成 T7" in prompt
    assert "term8 " not in prompt
    assert len(prompt) < 200
    # No term in the text: the plain template.
    assert HY15.render("Nothing to look up.", DE, EN, many) == HY15.render(
        "Nothing to look up.", DE, EN
    )


def test_hy_mt15_context_ends_with_a_newline() -> None:
    options = TranslationOptions(context="The meeting was moved.")
    assert HY15.render("It starts at 9.", ZH, EN, options) == (
        "The meeting was moved.\n"
        "参考上面的信息，把下面的文本翻译成中文，注意不需要翻译上文，也不要额外解释：\n"
        "It starts at 9.\n"
    )


def test_hy_mt15_formatted_translation_with_nested_tags() -> None:
    options = TranslationOptions(format="markup")
    text = '<p>Hello <b>bold <i class="x">and</i></b> world<br/></p>'
    assert HY15.render(text, ZH, EN, options) == (
        "将以下<source></source>之间的文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释，"
        "原文中的<sn></sn>标签表示标签内文本包含格式信息，需要在译文中相应的位置尽量保留该标签。"
        "输出格式为：<target>str</target>\n\n"
        "<source><s1>Hello <s2>bold <s3>and</s3></s2> world<s4></s4></s1></source>"
    )
    with pytest.raises(Unsupported, match="into Chinese only"):
        HY15.render(text, DE, EN, options)


def test_numbered_tags_come_back_as_the_original_ones() -> None:
    numbered = number_tags('<p>Hello <b>bold <i class="x">and</i></b> world<br/></p>')
    answer = "<target><s1>你好 <s2>粗体 <s3>和</s3></s2> 世界<s4></s4></s1></target>"
    assert numbered.restore(answer) == '<p>你好 <b>粗体 <i class="x">和</i></b> 世界<br/></p>'
    # An answer without the <target> wrapper, and a number the markup never had.
    assert number_tags("<b>x</b>").restore("<s1>y</s1><s9>z</s9>") == "<b>y</b><s9>z</s9>"


def test_hy_mt2_default_templates() -> None:
    assert HY2.render("Hello", ZH, EN) == (
        "将以下文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释：\n\nHello"
    )
    assert HY2.render("Bonjour", DE, FR) == (
        "Translate the following text into German. Note that you should only output the "
        "translated result without any additional explanation:\n\nBonjour"
    )


def test_hy_mt2_terminology_in_both_languages() -> None:
    assert HY2.render("部署 Cloud Native 和 Load Balancer。", EN, ZH, TERMS) == (
        "参考下面的翻译：\n"
        "Cloud Native 翻译成 云原生\n"
        "Load Balancer 翻译成 负载均衡器\n"
        "将以下文本翻译为英语，注意只需要输出翻译后的结果，不要额外解释：\n"
        "\n"
        "部署 Cloud Native 和 Load Balancer。"
    )
    assert HY2.render("Deploy the Cloud Native load balancer.", DE, EN, TERMS) == (
        "Reference the following translations:\n"
        "Cloud Native translates to 云原生\n"
        "Load Balancer translates to 负载均衡器\n"
        "\n"
        "Translate the following text into German. Note that you must ONLY output the "
        "translated result without any additional explanation:\n"
        "\n"
        "Deploy the Cloud Native load balancer."
    )


def test_hy_mt2_style() -> None:
    options = TranslationOptions(style="formal")
    assert HY2.render("Hi", ZH, EN, options) == (
        "请将以下文本翻译为中文。\n注意翻译的风格要严格符合【formal】\n\nHi"
    )
    assert HY2.render("Hi", DE, EN, options) == (
        "Please translate the following text into German. Note that the translation style must "
        "strictly conform to [formal]:\n\nHi"
    )


def test_hy_mt2_preferences_are_numbered_before_the_instruction() -> None:
    options = TranslationOptions(preferences=("Keep it short", "Use British spelling"))
    assert HY2.render("Hallo", ZH, DE, options) == (
        "【待翻译文本】\nHallo\n\n【翻译任务】\n1、Keep it short\n2、Use British spelling\n"
        "3、将【待翻译文本】翻译为中文。"
    )
    assert HY2.render("Hallo", EN, DE, options) == (
        "[Source Text]\nHallo\n\n[Translation Tasks]\n1. Keep it short\n2. Use British "
        "spelling\n3. Translate the [Source Text] into English."
    )


def test_hy_mt2_background_context() -> None:
    options = TranslationOptions(context="A cooking blog.")
    assert HY2.render("Stir well.", ZH, EN, options) == (
        "【背景信息】\nA cooking blog.\n\n"
        "请结合背景信息将以下文本翻译为中文。\n\n【待翻译文本】\nStir well."
    )
    assert HY2.render("Stir well.", DE, EN, options) == (
        "[Background Information]\nA cooking blog.\n\nPlease translate the following text into "
        "German, taking the provided background information into consideration.\n\n"
        "[Source Text]\nStir well."
    )


def test_options_a_family_lacks_are_refused_by_name() -> None:
    with pytest.raises(Unsupported, match="glossary: not supported by the Hunyuan-MT-7B"):
        PromptFormat(HUNYUAN_MT).render("Hi", DE, EN, TERMS)
    with pytest.raises(Unsupported, match=r"style: not supported by the HY-MT1\.5"):
        HY15.render("Hi", DE, EN, TranslationOptions(style="formal"))
    with pytest.raises(Unsupported, match="format: not supported by the Hunyuan-MT-7B"):
        PromptFormat(HUNYUAN_MT).render("{}", DE, EN, TranslationOptions(format="json"))
    with pytest.raises(Unsupported, match="one option at a time"):
        HY2.render("Hi", DE, EN, TranslationOptions(style="formal", context="x"))


def test_inserted_text_is_never_read_as_template() -> None:
    options = TranslationOptions(glossary=(("{target}", "{text}"),), context=None)
    prompt = HY2.render("{terms} {target}", DE, EN, options)
    assert "{target} translates to {text}" in prompt
    assert prompt.endswith("\n\n{terms} {target}")


@pytest.mark.parametrize(
    ("model_id", "family", "size", "expected"),
    [
        (None, None, None, ("hunyuan-mt", "7b", "hunyuan-7b")),
        ("tencent/Hunyuan-MT-7B", None, None, ("hunyuan-mt", "7b", "hunyuan-7b")),
        ("tencent/HY-MT1.5-1.8B", None, None, ("hy-mt1.5", "1.8b", "hy")),
        ("tencent/HY-MT1.5-7B", None, None, ("hy-mt1.5", "7b", "hunyuan-7b")),
        ("tencent/Hy-MT2-30B-A3B", None, None, ("hy-mt2", "30b-a3b", "hy-v3")),
        ("/models/my-finetune", "hy-mt2", "1.8b", ("hy-mt2", "1.8b", "hy")),
        (None, "hy-mt1.5", None, ("hy-mt1.5", "7b", "hunyuan-7b")),
    ],
)
def test_the_model_is_resolved_from_its_name_or_the_settings(
    model_id: str | None, family: str | None, size: str | None, expected: tuple[str, str, str]
) -> None:
    spec = resolve_model(model_id, family, size)
    assert (spec.family, spec.size, spec.chat_format) == expected


def test_an_unknown_model_or_size_is_refused_with_what_to_set() -> None:
    with pytest.raises(ValueError, match="HYMT_MODEL_FAMILY"):
        resolve_model("meta-llama/Llama-3-8B")
    with pytest.raises(ValueError, match="sizes 7b"):
        resolve_model(None, "hunyuan-mt", "1.8b")
    assert resolve_model("tencent/Hy-MT2-30B-A3B").decoding.top_p == 1.0


def test_hy_mt2_delimiters() -> None:
    options = TranslationOptions(delimiter="@@")
    assert HY2.render("a@@b", ZH, EN, options) == (
        "请将以下文本准确翻译为中文。\n"
        "你必须在译文中保留等量的分隔符，绝对不可遗漏、转义或翻译该符号，并注意分隔符的位置。\n\n"
        "a@@b"
    )
    assert HY2.render("a@@b", DE, EN, options) == (
        "Please accurately translate the following text into German.\n"
        "You must retain the exact same number of delimiters in the translation. Strictly do not "
        "omit, escape, or translate these symbols, and pay close attention to their placement.\n\n"
        "a@@b"
    )


def test_hy_mt2_structured_data() -> None:
    data = '{"title": "Hello {{name}}", "count": "%d items"}'
    assert HY2.render(data, ZH, EN, TranslationOptions(format="json")) == (
        "# 任务目标\n"
        f"将下方{data}中的JSON格式数据翻译为中文。\n"
        "\n"
        "# 严格约束\n"
        "1. **结构锁定**：绝对保持原有的JSON数据结构、缩进和层级完全不变。\n"
        "2. **选择性翻译**：仅翻译面向用户展示的可见文本内容。\n"
        "3. **禁止修改**：**严禁**翻译或更改任何代码标签、键名 (Key)、变量占位符（如 `{{var}}`、"
        "`${var}`、`%s`、`%d` 等）或代码属性。\n"
        "\n"
        "# 数据输入\n"
        f"{data}"
    )
    assert HY2.render("| a | b |", FR, EN, TranslationOptions(format="markdown")) == (
        "### Task\n"
        "Translate the user-facing text within the following Markdown data into French.\n"
        "\n"
        "### Strict Rules\n"
        "1. **Structure Preservation:** You MUST preserve the original Markdown data structure, "
        "nesting, hierarchy, and indentation exactly as they are.\n"
        "2. **Selective Translation:** Translate ONLY the visible, user-facing text "
        "content/values.\n"
        "3. **Strict Non-Translation:** NEVER translate or alter code tags, keys, properties, "
        "object names, or variable placeholders. Leave them exactly in their original "
        "English/code form.\n"
        "\n"
        "### Source Data\n"
        "| a | b |"
    )


def test_each_family_refuses_the_formats_it_has_no_template_for() -> None:
    with pytest.raises(Unsupported, match=r"'markup' is not supported by the Hy-MT2.*html"):
        HY2.render("<b>x</b>", ZH, EN, TranslationOptions(format="markup"))
    with pytest.raises(Unsupported, match=r"'json' is not supported by the HY-MT1\.5"):
        HY15.render("{}", ZH, EN, TranslationOptions(format="json"))
    with pytest.raises(Unsupported, match=r"delimiter: not supported by the HY-MT1\.5"):
        HY15.render("a@@b", ZH, EN, TranslationOptions(delimiter="@@"))


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("<think>\n\n</think>\n\nBonjour", "Bonjour"),
        ("<think>the user wants French</think>Bonjour", "Bonjour"),
        ("  <think></think> Bonjour le monde", "Bonjour le monde"),
        ("Bonjour <think>", "Bonjour <think>"),
        ("<think>never closed", "<think>never closed"),
        ("<thin", "<thin"),
    ],
)
def test_think_blocks_leave_answers_whole_and_streamed(answer: str, expected: str) -> None:
    assert without_thoughts(answer) == expected
    for size in (1, 2, 3, 7):
        stream = ThoughtFilter()
        pieces = [answer[i : i + size] for i in range(0, len(answer), size)]
        assert "".join(stream.feed(p) for p in pieces) + stream.rest() == expected
