"""Which model is served: its family and size, from the settings or read from the model's name,
and what follows from them for both processes (the chat format, the shipped config of a dummy
load, the generation prompt, the decoding defaults). The families' prompt templates are the API
process's (``frontend.translation.families``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from service.config.kinds import ChatFormat, FamilyName, ModelSize
from service.contract.types import MODEL_CARD_DECODING, Decoding

FAMILY_NAMES: tuple[FamilyName, ...] = ("hunyuan-mt", "hy-mt1.5", "hy-mt2")
# Sizes each family comes in (the published checkpoints).
SIZES: Mapping[str, tuple[ModelSize, ...]] = {
    "hunyuan-mt": ("7b",),
    "hy-mt1.5": ("1.8b", "7b"),
    "hy-mt2": ("1.8b", "7b", "30b-a3b"),
}
_CHAT_FORMATS: Mapping[str, ChatFormat] = {"7b": "hunyuan-7b", "1.8b": "hy", "30b-a3b": "hy-v3"}
# Hy-MT2-30B-A3B's own generation settings (its README); the others keep the model card's.
HY_MT2_MOE_DECODING = Decoding(
    greedy=False, temperature=0.7, top_k=0, top_p=1.0, repetition_penalty=1.0
)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the service serves: the family, the size, and what follows from them."""

    family: FamilyName
    size: ModelSize

    @property
    def chat_format(self) -> ChatFormat:
        """The 7B models share Hunyuan-MT-7B's turn format; the 1.8B ones use the ``hy_``
        tokens; the 30B-A3B uses them with its own end-of-answer token (``hy_v3``)."""
        return _CHAT_FORMATS[self.size]

    @property
    def decoding(self) -> Decoding:
        return HY_MT2_MOE_DECODING if self.size == "30b-a3b" else MODEL_CARD_DECODING

    @property
    def shipped_config(self) -> str:
        """The name of the config in ``service/engine/configs`` for the ``dummy`` load."""
        return f"{self.family}-{self.size}"

    @property
    def add_generation_prompt(self) -> bool:
        """Whether the chat template's generation prompt follows the user turn: the Hy-MT2
        README renders with it; Hunyuan-MT and HY-MT1.5 (README) without it."""
        return self.family == "hy-mt2"


def resolve_model(
    model_id: str | None, family: str | None = None, size: str | None = None
) -> ModelSpec:
    """The model to serve, from the explicit ``family`` and ``size`` or else from ``model_id``'s
    name; ``ValueError`` with what to set when neither tells."""
    name = (model_id or "").lower().replace("_", "-")
    if family is None:
        if model_id is None:
            family = "hunyuan-mt"  # the demo model
        elif "hunyuan-mt" in name:
            family = "hunyuan-mt"
        elif "hy-mt1.5" in name or "hy-mt1-5" in name:
            family = "hy-mt1.5"
        elif "hy-mt2" in name:
            family = "hy-mt2"
        else:
            raise ValueError(
                f"cannot tell the model family of {model_id!r} from its name: set "
                f"HYMT_MODEL_FAMILY to one of {', '.join(FAMILY_NAMES)} (and HYMT_MODEL_SIZE)"
            )
    known: dict[str, FamilyName] = {name: name for name in FAMILY_NAMES}
    if family not in known:
        raise ValueError(f"unknown model family {family!r}: one of {', '.join(FAMILY_NAMES)}")
    sizes = SIZES[family]
    if size is None:
        found = [s for s in ("30b-a3b", "1.8b", "7b") if s in name]
        size = found[0] if found else ("7b" if "7b" in sizes else sizes[0])
    chosen = [s for s in sizes if s == size]
    if not chosen:
        raise ValueError(f"{family} comes in sizes {', '.join(sizes)}, not {size!r}")
    return ModelSpec(known[family], chosen[0])
