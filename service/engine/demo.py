"""The embedded demo models: the real Hunyuan architectures at a tiny size, built locally.

With no model configured the service serves one of these, so that it runs end to end on any
machine without network or GPU: seeded random weights and a byte-level BPE tokenizer trained here
on the multilingual text in ``corpus/``, with the special tokens and chat template of one of the
family's turn formats:

- ``hunyuan-7b``: Hunyuan-MT-7B, HY-MT1.5-7B and Hy-MT2-7B (``<|startoftext|>`` ...
  ``<|extra_0|>``, answers end with ``<|eos|>``), a ``HunYuanDenseV1ForCausalLM`` (QK-norm,
  alpha-NTK RoPE as the 7B);
- ``hy``: HY-MT1.5-1.8B and Hy-MT2-1.8B (the ``hy_`` tokens: user, assistant, answers end with
  place holder no. 2), the same architecture;
- ``hy-v3``: Hy-MT2-30B-A3B (the ``hy_`` tokens, answers end with ``hy_eos``), a
  ``HYV3ForCausalLM`` mixture of experts.

Their output is noise: they exercise the loading, batching and decoding code, not translation.

The folder is built once (a few seconds) and reused; it is written beside its final place and
renamed into it, so a crash never leaves a half-built model behind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    HunYuanDenseV1Config,
    HunYuanDenseV1ForCausalLM,
    HYV3Config,
    HYV3ForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from service.engine.corpus import corpus_texts
from service.engine.folders import build_once

log = logging.getLogger(__name__)

# Bump when anything below changes, so existing builds are not reused.
DEMO_VERSION = "demo-v1"
SEED = 20250901

# The Hunyuan family's special tokens, in the order of their real ids (127957...).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|startoftext|>",
    "<|bos|>",
    "<|eos|>",
    "<|pad|>",
    "<|extra_0|>",
    "<|extra_1|>",
    "<|extra_2|>",
    "<|extra_3|>",
    "<|extra_4|>",
)

# The Hunyuan chat format: <|startoftext|>{system}<|extra_4|>{user}<|extra_0|>{assistant}<|eos|>
CHAT_TEMPLATE = (
    "{{ '<|startoftext|>' }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '<|extra_4|>' }}"
    "{% elif message['role'] == 'user' %}{{ message['content'] + '<|extra_0|>' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + '<|eos|>' }}"
    "{% endif %}"
    "{% endfor %}"
)

# The hy_ turn format of the 1.8B models (their chat_template.jinja as Tencent's LlamaFactory
# template gives it): no system turn by default; without a generation prompt the template ends
# with place holder no. 8.
HY_BOS = "<｜hy_begin▁of▁sentence｜>"
HY_USER = "<｜hy_User｜>"
HY_ASSISTANT = "<｜hy_Assistant｜>"
HY_END = "<｜hy_place▁holder▁no▁2｜>"
HY_SYSTEM_END = "<｜hy_place▁holder▁no▁3｜>"
HY_NO_PROMPT = "<｜hy_place▁holder▁no▁8｜>"
HY_EOS = "<｜hy_eos｜>"  # the 30B-A3B's end of answer
HY_PAD = "<｜hy_pad｜>"  # the real name of the 1.8B's pad token (id 120002) is not published
HY_SPECIAL_TOKENS = (
    HY_BOS,
    HY_USER,
    HY_ASSISTANT,
    HY_END,
    HY_SYSTEM_END,
    HY_NO_PROMPT,
    HY_EOS,
    HY_PAD,
)


def _hy_template(system_end: str, answer_end: str) -> str:
    return (
        "{{ '" + HY_BOS + "' }}"
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ message['content'] + '" + system_end + "' }}"
        "{% elif message['role'] == 'user' %}{{ '" + HY_USER + "' + message['content'] }}"
        "{% elif message['role'] == 'assistant' %}"
        "{{ '" + HY_ASSISTANT + "' + message['content'] + '" + answer_end + "' }}"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '" + HY_ASSISTANT + "' }}"
        "{% else %}{{ '" + HY_NO_PROMPT + "' }}{% endif %}"
    )


@dataclass(frozen=True, slots=True)
class DemoFormat:
    """One turn format's demo: its tokens, chat template and architecture."""

    folder: str
    special_tokens: tuple[str, ...]
    chat_template: str
    bos: str
    eos: str
    pad: str
    architecture: str  # "dense" or "moe"
    # The 7B vocabulary's end-of-document token (the config's eod_token_id), where there is one.
    eod: str | None = None


DEMO_FORMATS = {
    "hunyuan-7b": DemoFormat(
        DEMO_VERSION,
        SPECIAL_TOKENS,
        CHAT_TEMPLATE,
        "<|startoftext|>",
        "<|eos|>",
        "<|pad|>",
        "dense",
        eod="<|endoftext|>",
    ),
    "hy": DemoFormat(
        "demo-hy-v1",
        HY_SPECIAL_TOKENS,
        _hy_template(HY_SYSTEM_END, HY_END),
        HY_BOS,
        HY_END,
        HY_PAD,
        "dense",
    ),
    # Hy-MT2-30B-A3B: the system text follows the BOS without a tag of its own.
    "hy-v3": DemoFormat(
        "demo-hy-v3-v1", HY_SPECIAL_TOKENS, _hy_template("", HY_EOS), HY_BOS, HY_EOS, HY_PAD, "moe"
    ),
}

VOCAB_SIZE = 4096


def demo_name(shipped_config: str) -> str:
    """The name the demo model of a family and size is served under."""
    if shipped_config == "hunyuan-mt-7b":
        return f"hunyuan-mt-{DEMO_VERSION}"  # the name it has always had
    return f"{shipped_config}-{DEMO_VERSION}"


def ensure_demo_model(data_dir: Path, chat_format: str = "hunyuan-7b") -> Path:
    """The path of the demo model of ``chat_format`` under ``data_dir``, built first if missing."""
    demo = DEMO_FORMATS[chat_format]
    target = data_dir / demo.folder
    if not (target / "config.json").is_file():
        log.info("building demo model", extra={"path": str(target), "chat_format": chat_format})
    return build_once(target, lambda folder: _build(folder, demo))


def _build(folder: Path, demo: DemoFormat) -> None:
    tokenizer = _train_tokenizer(demo)
    named = (demo.bos, demo.eos, demo.pad, *([demo.eod] if demo.eod else []))
    ids = {token: _token_id(tokenizer, token) for token in named}
    config = _config(demo, len(tokenizer), ids)
    torch.manual_seed(SEED)
    # The model classes take their own config class; ``_config`` built the matching one.
    model: PreTrainedModel = (
        HYV3ForCausalLM(config)  # type: ignore[arg-type]
        if demo.architecture == "moe"
        else HunYuanDenseV1ForCausalLM(config)  # type: ignore[arg-type]
    )
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _config(demo: DemoFormat, vocab_size: int, ids: dict[str, int]) -> PretrainedConfig:
    tiny: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 8192,
        # Untied like the 7B checkpoint; tied random embeddings make greedy decoding echo the
        # last prompt token forever.
        "tie_word_embeddings": False,
        "bos_token_id": ids[demo.bos],
        "eos_token_id": ids[demo.eos],
        "pad_token_id": ids[demo.pad],
    }
    if demo.architecture == "moe":
        return HYV3Config(
            num_experts=4,
            num_experts_per_tok=2,
            num_shared_experts=1,
            moe_intermediate_size=32,
            mlp_layer_types=["dense", "sparse"],
            **tiny,
        )
    if demo.eod is not None:
        tiny["eod_token_id"] = ids[demo.eod]
    return HunYuanDenseV1Config(
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "dynamic",
            "rope_theta": 10000.0,
            "alpha": 1000.0,
            "factor": 1.0,
        },
        **tiny,
    )


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int)
    return found


def _train_tokenizer(demo: DemoFormat) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(demo.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus_texts(), trainer=trainer)
    # Added after training so the special tokens sit at the end of the vocabulary, as in Hunyuan.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=demo.bos,
        eos_token=demo.eos,
        pad_token=demo.pad,
        additional_special_tokens=list(demo.special_tokens),
        chat_template=demo.chat_template,
        padding_side="left",
    )
    return tokenizer
