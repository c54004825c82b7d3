"""Hunyuan-MT translation service: FastAPI in front of a micro-batched transformers worker."""

__version__ = "0.1.0"
