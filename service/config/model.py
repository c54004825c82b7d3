"""What model is served and how its weights are loaded, and how it decodes by default."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from service.config.kinds import (
    Device,
    Dtype,
    FamilyName,
    LoadFormat,
    ModelSize,
    Quantization,
    Toggle,
)
from service.config.section import Section


def _default_data_dir() -> Path:
    return Path.home() / ".cache" / "hunyuan-mt-service"


class ModelSettings(Section):
    model_id: str | None = Field(
        None,
        description="Hugging Face id or local path of the model, e.g. tencent/Hunyuan-MT-7B. "
        "Unset: the embedded demo model (random weights, output is noise).",
    )
    model_revision: str | None = Field(
        None, description="Git revision (branch, tag or commit) of model_id on the Hub."
    )
    model_family: FamilyName | None = Field(
        None,
        description="The model family (its prompt templates, chat format and options). Unset: "
        "read from model_id's name (Hunyuan-MT, HY-MT1.5, Hy-MT2; any other name is refused at "
        "start). Without model_id it picks the demo model of that family's chat format.",
    )
    model_size: ModelSize | None = Field(
        None,
        description="The model's size within its family (the 1.8B models use another chat "
        "format, the 30B-A3B another architecture). Unset: read from model_id's name, else 7b "
        "(1.8b for a family without a 7B).",
    )
    add_generation_prompt: Toggle = Field(
        "auto",
        description="Whether prompts end with the chat template's generation prompt. auto: as "
        "the family's README renders it (Hy-MT2 on; Hunyuan-MT and HY-MT1.5 off).",
    )
    load_format: LoadFormat = Field(
        "auto",
        description="auto = weights from model_id (or the demo model); dummy = seeded random "
        "weights of model_id's config (the shipped config of the family and size when model_id "
        "is unset) with the demo tokenizer, for benchmarks without the real weights.",
    )
    dtype: Dtype = Field(
        "auto",
        description="Weights dtype; auto = bfloat16 on CUDA (float16 without bf16), "
        "float32 on CPU.",
    )
    quantization: Quantization = Field(
        "none",
        description="Weight quantization: fp8 (float8 e4m3 weights with one scale per output "
        "row, quantized at load; compute capability 8.9+); nf4 (bitsandbytes 4-bit, double "
        "quantized) or int8 (bitsandbytes' rows, multiplied with 16-bit activations), quantized "
        "by bitsandbytes while loading, for GPUs that do not hold the 16-bit weights.",
    )
    quantize_lm_head: bool = Field(
        False,
        description="With nf4/int8, quantize the output layer (lm_head) too; bitsandbytes keeps "
        "it in the model's dtype by default.",
    )
    device: Device = Field("auto", description="auto = CUDA when present, else CPU.")
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Folder for what the service builds and keeps: the demo model, compiled "
        "kernels, documents and glossaries.",
    )
    warmup: bool = Field(True, description="Run one generation per prompt template before ready.")


class DecodingSettings(Section):
    """Defaults of the Hunyuan-MT model card; a family's own defaults where one is unset."""

    greedy: bool = Field(False, description="Greedy decoding instead of sampling.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature.")
    top_k: int = Field(20, ge=0, description="Top-k sampling cut-off (0 disables it).")
    top_p: float = Field(0.6, gt=0, le=1, description="Nucleus sampling cut-off.")
    repetition_penalty: float = Field(1.05, gt=0, description="Repetition penalty.")
    max_new_tokens: int = Field(1024, ge=1, description="Upper bound of generated tokens per text.")
    output_tokens_ratio: float = Field(
        2.0,
        gt=0,
        description="Token budget per text = min(max_new_tokens, ceil(ratio * source tokens) "
        "+ output_tokens_margin): a translation is rarely longer than twice its source.",
    )
    output_tokens_margin: int = Field(
        16, ge=0, description="Constant part of the per-text token budget (see ratio)."
    )
