"""What the service writes about itself: its JSON logs."""

from __future__ import annotations

from pydantic import Field

from service.config.kinds import LogLevel
from service.config.section import Section


class ObservabilitySettings(Section):
    log_level: LogLevel = Field("info", description="Log level of the service's JSON logs.")
    log_texts: bool = Field(
        False, description="Write request texts into logs (off: texts are user data)."
    )
