"""Chat-formatted prompt encoding in which user text is always data.

The chat template is rendered once around a sentinel to learn the token ids before and after the
user turn (``<|startoftext|>`` ... ``<|extra_0|>`` for Hunyuan). The user turn itself is encoded by
a private copy of the fast tokenizer's backend with ``encode_special_tokens`` on, so a text that
contains ``<|eos|>`` or ``<|extra_0|>`` is tokenized as those characters and can never end the
turn or open a new one. The copy is never reconfigured after construction, which keeps it safe to
call from any thread.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

_SENTINEL = "\u2063USER-CONTENT\u2063"


class ChatPromptEncoder:
    """Encodes one user turn with the tokenizer's chat template (implements ``PromptEncoder``)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not tokenizer.is_fast:
            raise TypeError("a fast (Rust) tokenizer is required")
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=False
        )
        if not isinstance(rendered, str) or rendered.count(_SENTINEL) != 1:
            raise ValueError("the tokenizer's chat template does not render the user content once")
        before, after = rendered.split(_SENTINEL)
        backend: Tokenizer = tokenizer.backend_tokenizer
        # Template parts: special-token strings here are meant as special tokens.
        self._before = tuple(backend.encode(before, add_special_tokens=False).ids)
        self._after = tuple(backend.encode(after, add_special_tokens=False).ids)
        self._plain = Tokenizer.from_str(backend.to_str())
        self._plain.no_truncation()
        self._plain.no_padding()
        self._plain.encode_special_tokens = True

    @property
    def template_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Token ids the template puts before and after the user content."""
        return self._before, self._after

    def encode_chat(self, content: str) -> tuple[int, ...]:
        return self._before + self._encode_plain(content) + self._after

    def count_tokens(self, text: str) -> int:
        return len(self._encode_plain(text))

    def _encode_plain(self, text: str) -> tuple[int, ...]:
        return tuple(self._plain.encode(text, add_special_tokens=False).ids)
