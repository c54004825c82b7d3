"""The embedded demo model: the real Hunyuan-MT architecture at a tiny size, built locally.

With no model configured the service serves this, so that it runs end to end on any machine
without network or GPU: a ``HunYuanDenseV1ForCausalLM`` (same layers, QK-norm and alpha-NTK RoPE
as Hunyuan-MT-7B) with seeded random weights, and a byte-level BPE tokenizer trained here on the
multilingual text in ``corpus/``, carrying the Hunyuan special tokens and chat template.
Its output is noise: it exercises the loading, batching and decoding code, not translation.

The folder is built once (a few seconds) and reused; it is written beside its final place and
renamed into it, so a crash never leaves a half-built model behind.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    HunYuanDenseV1Config,
    HunYuanDenseV1ForCausalLM,
    PreTrainedTokenizerFast,
)

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

VOCAB_SIZE = 4096


def corpus_texts() -> list[str]:
    """The multilingual sentences shipped with the package, one per line, all languages."""
    lines: list[str] = []
    folder = resources.files("service.engine").joinpath("corpus")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".txt"):
            lines.extend(line for line in entry.read_text("utf-8").splitlines() if line.strip())
    return lines


def ensure_demo_model(data_dir: Path) -> Path:
    """The path of the demo model under ``data_dir``, building it first if it is missing."""
    target = data_dir / DEMO_VERSION
    if not (target / "config.json").is_file():
        log.info("building demo model", extra={"path": str(target)})
    return build_once(target, _build)


def _build(folder: Path) -> None:
    tokenizer = _train_tokenizer()
    ids = {token: _token_id(tokenizer, token) for token in SPECIAL_TOKENS}
    config = HunYuanDenseV1Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "dynamic",
            "rope_theta": 10000.0,
            "alpha": 1000.0,
            "factor": 1.0,
        },
        # Untied like the 7B checkpoint; tied random embeddings make greedy decoding echo the
        # last prompt token forever.
        tie_word_embeddings=False,
        bos_token_id=ids["<|startoftext|>"],
        eos_token_id=ids["<|eos|>"],
        pad_token_id=ids["<|pad|>"],
        eod_token_id=ids["<|endoftext|>"],
    )
    torch.manual_seed(SEED)
    model = HunYuanDenseV1ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int)
    return found


def _train_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus_texts(), trainer=trainer)
    # Added after training so the special tokens sit at the end of the vocabulary, as in Hunyuan.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|startoftext|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        additional_special_tokens=list(SPECIAL_TOKENS),
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )
    return tokenizer
