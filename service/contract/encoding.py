"""Chat-formatted prompt encoding in which user text is always data.

Built from the ``TokenizerSpec`` the engine process reports: the template's token ids before and
after the user turn, and the fast tokenizer itself. The user turn is encoded by a copy of the
tokenizer with ``encode_special_tokens`` on, so a text that contains ``<|eos|>`` or
``<|extra_0|>`` is tokenized as those characters and can never end the turn or open a new one.
The copy is never reconfigured after construction, which keeps it safe to call from any thread
(the translator calls it from its worker pool, never on the event loop).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from service.contract.tokenizer import TokenizerSpec


class ChatPromptEncoder:
    """Encodes one user turn with the model's chat template (implements ``PromptEncoder``)."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self._before = tuple(spec.before)
        self._after = tuple(spec.after)
        self._plain = Tokenizer.from_str(spec.tokenizer_json)
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

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._plain.decode(list(ids), skip_special_tokens=False))

    def _encode_plain(self, text: str) -> tuple[int, ...]:
        return tuple(self._plain.encode(text, add_special_tokens=False).ids)
