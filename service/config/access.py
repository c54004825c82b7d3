"""Who may use the service and how much: keys, rate limits, character quotas."""

from __future__ import annotations

from pathlib import Path

import limits
from pydantic import Field, SecretStr, field_validator

from service.config.section import Section


class AccessSettings(Section):
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="Accepted API keys (JSON list); with none here or in api_keys_file, no key "
        "is required. Clients send Authorization: Bearer <key>.",
    )
    api_keys_file: Path | None = Field(
        None, description="File of accepted API keys, one per line (# starts a comment)."
    )
    rate_limit: str | None = Field(
        None,
        description="Requests per client (API key, or address without keys) and window, in the "
        "limits library's notation, e.g. '120/minute'. Unset: no limit.",
    )
    char_quota: str | None = Field(
        None,
        description="Characters of text per client and window, e.g. '200000/hour'. Unset: none.",
    )

    @field_validator("rate_limit", "char_quota")
    @classmethod
    def _check_rate(cls, value: str | None) -> str | None:
        if value is not None:
            limits.parse(value)  # raises ValueError on a malformed rate
        return value

    def keys(self) -> tuple[str, ...]:
        """Every accepted key, from the list and the file."""
        keys = [key.get_secret_value() for key in self.api_keys]
        if self.api_keys_file is not None:
            lines = self.api_keys_file.read_text("utf-8").splitlines()
            keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        return tuple(keys)
