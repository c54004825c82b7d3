"""The tokenizer as it crosses from the engine process to the API process."""

from __future__ import annotations

import msgspec


class TokenizerSpec(msgspec.Struct, array_like=True):
    """Everything the API process needs to encode prompts exactly as the engine would."""

    # The fast tokenizer's serialized form (tokenizer.json).
    tokenizer_json: str
    # Token ids the chat template puts before and after the user's content.
    before: list[int]
    after: list[int]
