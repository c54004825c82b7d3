"""The base of every settings sub-model: frozen, strict about names, and named flat.

A field's flat name (its alias where it has one, else its name) is what the environment
(``HYMT_<NAME>``), the ``.env`` file, the command line (``--<name>``) and ``Settings(**flat)``
call it; sub-models may also be built by field name.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo


class Section(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )

    @classmethod
    def flat_fields(cls) -> Iterator[tuple[str, str, FieldInfo]]:
        """(flat name, field name, field) of each field."""
        for name, info in cls.model_fields.items():
            yield info.alias or name, name, info
