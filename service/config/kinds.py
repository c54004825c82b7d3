"""The named choices settings take, each defined once for every layer that reads it."""

from __future__ import annotations

from typing import Literal

# A feature the service turns on where it runs (auto), always (on, refusing to start where it
# cannot) or never (off).
Toggle = Literal["auto", "on", "off"]
# The fast engine is the one engine (auto is it).
EngineKind = Literal["auto", "fast"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Quantization = Literal["none", "nf4", "int8", "fp8"]
Device = Literal["auto", "cuda", "cpu"]
LoadFormat = Literal["auto", "dummy"]
FamilyName = Literal["hunyuan-mt", "hy-mt1.5", "hy-mt2"]
ModelSize = Literal["1.8b", "7b", "30b-a3b"]
# The turn format of a model family and size (the demo model of a dummy load follows it).
ChatFormat = Literal["hunyuan-7b", "hy", "hy-v3"]
LogLevel = Literal["debug", "info", "warning", "error"]
