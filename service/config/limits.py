"""How much one request may ask for, and how much the service admits at once."""

from __future__ import annotations

from pydantic import Field, model_validator

from service.config.section import Section


class LimitsSettings(Section):
    max_text_chars: int = Field(
        5000,
        ge=1,
        description="Most characters in one segment; a longer text (any route or dialect) is "
        "translated as a document (up to max_document_chars), cut into segments.",
    )
    max_document_chars: int = Field(
        50_000,
        ge=1,
        description="Most characters of a text translated as a document (POST /translate, "
        "segment by segment; each segment takes one admitted place).",
    )
    max_input_tokens: int = Field(
        2048,
        ge=1,
        description="Most tokens of one segment; a text of more is translated as a document, "
        "cut into segments (an OpenAI chat turn given as it is: 422).",
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="Most tokens of one whole prompt: the text with the glossary terms found in "
        "it, the context, style, preferences and the template; over it, 422 naming the largest "
        "part (unset: max_input_tokens + 2048).",
    )
    max_batch_items: int = Field(64, ge=1, description="Most texts in one /batch_translate.")
    max_body_bytes: int = Field(
        1_048_576, ge=1024, description="Largest request body in bytes; bigger gets 413."
    )
    max_queue_size: int = Field(
        4096,
        ge=1,
        description="Most texts admitted and not yet answered (waiting or generating); beyond "
        "it, and for requests that could not finish inside their deadline, 429 at once. Twice "
        "the fast engine's 2,048 decode rows on CUDA, so that a full engine has its next "
        "requests waiting.",
    )

    @model_validator(mode="after")
    def _check_prompt(self) -> LimitsSettings:
        if self.max_prompt_tokens is not None and self.max_input_tokens > self.max_prompt_tokens:
            raise ValueError("max_input_tokens must not exceed max_prompt_tokens")
        return self

    @property
    def prompt_tokens(self) -> int:
        """The prompt limit in force."""
        return self.max_prompt_tokens or self.max_input_tokens + 2048
