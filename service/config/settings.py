"""``Settings``: the service's sub-models composed into one, read at the edge.

Flat names in, sections out: ``Settings(port=9001, fast_num_pages=64)``, ``HYMT_PORT`` and
``--port`` all set ``settings.server.port``. Precedence: arguments (flags, via ``from_flags``),
the environment, the ``.env`` file, the defaults. The edge splits the settings into each
layer's own config (``engine_config``, ``policy_config``, ``translation_config``, ...); nothing
below it sees ``Settings``. The API process's layers are configured by
``frontend.layers``; this package imports nothing of the layers it configures.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from service.config.access import AccessSettings
from service.config.cache import CacheSettings
from service.config.documents import DocumentsSettings
from service.config.engine import EngineConfig, EngineSettings
from service.config.limits import LimitsSettings
from service.config.model import DecodingSettings, ModelSettings
from service.config.models import ModelSpec, resolve_model
from service.config.observability import ObservabilitySettings
from service.config.reliability import ReliabilitySettings
from service.config.section import Section
from service.config.server import ServerSettings
from service.config.sources import FlatSource, parse_flags
from service.contract.types import Decoding


class Settings(BaseSettings):
    """All settings of the translation service, by concern."""

    model_config = SettingsConfigDict(
        env_prefix="HYMT_", env_file=".env", env_file_encoding="utf-8", frozen=True
    )

    SECTIONS: ClassVar[Mapping[str, type[Section]]] = {
        "server": ServerSettings,
        "model": ModelSettings,
        "decoding": DecodingSettings,
        "engine": EngineSettings,
        "limits": LimitsSettings,
        "reliability": ReliabilitySettings,
        "access": AccessSettings,
        "cache": CacheSettings,
        "documents": DocumentsSettings,
        "observability": ObservabilitySettings,
    }

    server: ServerSettings = Field(default_factory=ServerSettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    decoding: DecodingSettings = Field(default_factory=DecodingSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    reliability: ReliabilitySettings = Field(default_factory=ReliabilitySettings)
    access: AccessSettings = Field(default_factory=AccessSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    documents: DocumentsSettings = Field(default_factory=DocumentsSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)

    def __init__(self, **values: Any) -> None:
        """``values`` by flat name (``port=9001``), or a section whole (``server=...``)."""
        super().__init__(**values)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environment = getattr(env_settings, "env_vars", {})
        dotenv = getattr(dotenv_settings, "env_vars", {})
        return (
            init_settings,
            FlatSource(settings_cls, environment, cls.SECTIONS),
            FlatSource(settings_cls, dotenv, cls.SECTIONS),
        )

    @classmethod
    def from_flags(cls, argv: list[str], **given: Any) -> Settings:
        """Settings with ``argv``'s flags over the environment (``python -m service``)."""
        return cls(**given, **parse_flags(argv, cls.SECTIONS))

    @classmethod
    def flat_names(cls) -> dict[str, str]:
        """Each flat name and the section it belongs to."""
        return {
            flat: title
            for title, section in cls.SECTIONS.items()
            for flat, _name, _info in section.flat_fields()
        }

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, data: Any) -> Any:
        """Flat names into their sections (a section may also be given whole)."""
        if not isinstance(data, dict):
            return data
        owners = cls.flat_names()
        nested: dict[str, dict[str, Any]] = {}
        for key, value in data.items():
            # ``engine`` is both a section and a setting (HYMT_ENGINE): a section comes whole.
            if key in cls.SECTIONS and isinstance(value, Section | dict):
                whole = value.model_dump() if isinstance(value, Section) else dict(value)
                nested.setdefault(key, {}).update(whole)
            elif key in owners:
                nested.setdefault(owners[key], {})[key] = value
            else:
                raise ValueError(f"unknown setting {key!r}")
        return nested

    @model_validator(mode="after")
    def _check_api_processes(self) -> Settings:
        processes = self.server.processes
        if self.server.api_processes is None and self.limits.max_queue_size < processes:
            # Chosen from the cores, not asked for: no more processes than queue places.
            fitted = self.server.model_copy(update={"api_processes": self.limits.max_queue_size})
            object.__setattr__(self, "server", fitted)
            processes = fitted.processes
        if processes == 1:
            return self
        if not hasattr(socket, "SO_REUSEPORT"):
            raise ValueError("api_processes > 1 needs SO_REUSEPORT (Linux, BSD, macOS)")
        if self.limits.max_queue_size < processes:
            raise ValueError("max_queue_size must be at least api_processes")
        return self

    @model_validator(mode="after")
    def _check_model(self) -> Settings:
        try:
            self.model_spec()
        except ValueError as error:
            raise ValueError(f"model: {error}") from None
        return self

    @property
    def uses_demo_model(self) -> bool:
        return self.model.model_id is None

    def model_spec(self) -> ModelSpec:
        """The family and size served (validated when the settings are built)."""
        model = self.model
        return resolve_model(model.model_id, model.model_family, model.model_size)

    def generation_defaults(self) -> Decoding:
        """The settings' decoding; the family's own defaults for what is not set (the
        Hy-MT2-30B-A3B samples differently from the other models)."""
        default = self.model_spec().decoding
        given = self.decoding.model_fields_set
        ours = self.decoding

        def pick(name: str) -> Any:
            return getattr(ours if name in given else default, name)

        return Decoding(
            greedy=ours.greedy,
            temperature=pick("temperature"),
            top_k=pick("top_k"),
            top_p=pick("top_p"),
            repetition_penalty=pick("repetition_penalty"),
        )

    def engine_config(self) -> EngineConfig:
        """All the engine process receives."""
        spec = self.model_spec()
        toggle = self.model.add_generation_prompt
        return EngineConfig(
            model=self.model,
            fast=self.engine,
            chat_format=spec.chat_format,
            shipped_config=spec.shipped_config,
            add_generation_prompt=(
                spec.add_generation_prompt if toggle == "auto" else toggle == "on"
            ),
            decoding=self.generation_defaults(),
            max_new_tokens=self.decoding.max_new_tokens,
            log_level=self.observability.log_level,
        )
