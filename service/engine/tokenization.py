"""What the API process needs of the model's tokenizer, taken from it once in the engine process.

The chat template is rendered once around a sentinel to learn the token ids before and after the
user turn (``<|startoftext|>`` ... ``<|extra_0|>`` for Hunyuan); with the tokenizer's serialized
form, that is all ``service.contract.encoding`` needs to encode prompts exactly as the model
expects, without transformers or torch in the API process.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from service.contract.tokenizer import TokenizerSpec

_SENTINEL = "\u2063USER-CONTENT\u2063"


def tokenizer_spec(
    tokenizer: PreTrainedTokenizerBase, add_generation_prompt: bool = False
) -> TokenizerSpec:
    """The serialized tokenizer and the chat template's ids around one user turn (followed by
    the template's generation prompt when ``add_generation_prompt``)."""
    if not tokenizer.is_fast:
        raise TypeError("a fast (Rust) tokenizer is required")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    if not isinstance(rendered, str) or rendered.count(_SENTINEL) != 1:
        raise ValueError("the tokenizer's chat template does not render the user content once")
    before, after = rendered.split(_SENTINEL)
    backend: Tokenizer = tokenizer.backend_tokenizer
    # Template parts: special-token strings here are meant as special tokens.
    return TokenizerSpec(
        tokenizer_json=backend.to_str(),
        before=backend.encode(before, add_special_tokens=False).ids,
        after=backend.encode(after, add_special_tokens=False).ids,
    )
