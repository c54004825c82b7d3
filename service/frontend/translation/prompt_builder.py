"""``PromptBuilder``: one text validated and turned into the exact request the model receives."""

from __future__ import annotations

from service.contract.errors import InvalidInput, TextTooLong, TooManyTokens
from service.contract.types import (
    Decoding,
    GenerationRequest,
    PromptEncoder,
)
from service.frontend.translation.detection import (
    Detection,
    LanguageDetector,
)
from service.frontend.translation.families import FAMILIES
from service.frontend.translation.languages import Language, LanguageTable
from service.frontend.translation.prompts import (
    PLAIN,
    PromptFormat,
    TranslationOptions,
    check_options,
    looks_chinese,
    option_parts,
)
from service.frontend.translation.results import (
    Prepared,
    TranslationConfig,
    token_budget,
)
from service.frontend.translation.tags import number_tags


class PromptBuilder:
    """Validates one text and turns it into the exact request the model receives.

    Shared by the translator and by whatever must reproduce the service's work exactly (the
    naive baseline of the benchmarks).
    """

    def __init__(
        self,
        settings: TranslationConfig,
        encoder: PromptEncoder,
        model_fingerprint: str,
        languages: LanguageTable | None = None,
        prompt_format: PromptFormat | None = None,
        detector: LanguageDetector | None = None,
    ) -> None:
        self._settings = settings
        self._encoder = encoder
        self._detector = detector
        self._fingerprint = model_fingerprint
        self.languages = languages or LanguageTable()
        self._format = prompt_format or PromptFormat(FAMILIES[settings.family])
        self.decoding = settings.decoding
        self.options = self._format.family.options

    def languages_of(
        self, target_lang: str, source_lang: str | None
    ) -> tuple[Language, Language | None]:
        """``source_lang`` None or ``auto``: detect it per text."""
        target = self.languages.resolve(target_lang, field="target_lang")
        if not source_lang or source_lang.lower() == "auto":
            return target, None
        return target, self.languages.resolve(source_lang, field="source_lang")

    def detect(self, text: str) -> Detection:
        if self._detector is None:
            raise InvalidInput("language detection is not available")
        return self._detector.detect(text)

    def check(self, text: str, field: str) -> None:
        """The checks cheap enough for the event loop (before admission): not empty, not too
        long, valid Unicode."""
        if not text.strip():
            raise InvalidInput(f"{field}: the text is empty")
        if len(text) > self._settings.max_text_chars:
            raise TextTooLong(
                f"{field}: {len(text)} characters, at most {self._settings.max_text_chars}"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(f"{field}: the text is not valid Unicode (lone surrogate)") from None

    def fits(self, text: str) -> bool:
        """Whether ``text`` has no more tokens than a text may (a document's segments)."""
        return self._encoder.count_tokens(text) <= self._settings.max_input_tokens

    def prepare(
        self,
        text: str,
        target: Language,
        source: Language | None,
        *,
        field: str,
        options: TranslationOptions = PLAIN,
    ) -> Prepared:
        """The request for ``text``; ``field`` names it in errors (``texts[3]``)."""
        self.check(text, field)
        source_tokens = self._encoder.count_tokens(text)
        if source_tokens > self._settings.max_input_tokens:
            raise TooManyTokens(
                f"{field}: {source_tokens} tokens, at most {self._settings.max_input_tokens}"
            )
        confidence = None
        if source is None and self._detector is not None:
            detection = self._detector.detect(text)
            source, confidence = detection.language, detection.confidence
        elif source is None and looks_chinese(text):
            source = self.languages["zh"]  # without a detector, at least pick the right template
        prompt = self._format.render(text, target, source, options)
        prompt_ids = self._encoder.encode_chat(prompt)
        if len(prompt_ids) > self._settings.max_prompt_tokens:
            raise self._too_long(field, len(prompt_ids), source_tokens, options, text)
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_new_tokens=token_budget(source_tokens, self._settings),
            decoding=self.decoding,
        )
        # The prompt carries every option's effect; the format also changes what is returned.
        key = (
            self._fingerprint,
            self._format.name,
            prompt,
            self.decoding,
            request.max_new_tokens,
            options.format,
        )
        restore = number_tags(text) if options.format == "markup" else None
        return Prepared(source, prompt, key, request, confidence, restore)

    def check_options(self, options: TranslationOptions) -> None:
        """The request's options within their bounds (cheap: before admission)."""
        check_options(options, self._settings.max_text_chars)

    def _too_long(
        self, field: str, tokens: int, text_tokens: int, options: TranslationOptions, text: str
    ) -> TextTooLong:
        """The error for a prompt over the limit, naming its largest part."""
        sizes = {"text": text_tokens} | {
            name: self._encoder.count_tokens(part)
            for name, part in option_parts(options, text).items()
        }
        largest = max(sizes, key=lambda name: sizes[name])
        parts = ", ".join(f"{name} {size}" for name, size in sizes.items())
        return TextTooLong(
            f"{largest}: the prompt for {field} would be {tokens} tokens, at most "
            f"{self._settings.max_prompt_tokens} ({parts}; the rest is the template)"
        )

    def chat_text(self, prepared: Prepared) -> str:
        """What the model reads for ``prepared``: the chat format's tokens written out."""
        return self._encoder.decode(prepared.request.prompt_ids)

    def prepare_chat(self, content: str, decoding: Decoding, max_new_tokens: int) -> Prepared:
        """The request for a user turn given as it is (no template of ours around it)."""
        field = "messages[0].content"
        self.check(content, field)
        tokens = self._encoder.count_tokens(content)
        if tokens > self._settings.max_input_tokens:
            raise TextTooLong(
                f"{field}: {tokens} tokens, at most {self._settings.max_input_tokens}"
            )
        request = GenerationRequest(
            prompt_ids=self._encoder.encode_chat(content),
            max_new_tokens=max_new_tokens,
            decoding=decoding,
        )
        key = (self._fingerprint, "chat", content, decoding, max_new_tokens)
        return Prepared(None, content, key, request)
