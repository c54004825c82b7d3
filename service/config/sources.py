"""Where settings come from, under their flat names: the environment and a ``.env`` file
(``HYMT_<NAME>``, any case) and the command line (``--<name>`` in kebab case).

Values arrive as strings (an empty one counts as unset); a list or mapping is read as JSON (as
pydantic-settings does for complex fields), everything else is left for the sub-model to
validate.
"""

from __future__ import annotations

import argparse
import json
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from service.config.section import Section

PREFIX = "hymt_"


def _complex(info: FieldInfo) -> bool:
    """Whether the field holds a list or a mapping (given as JSON)."""
    kinds = [info.annotation, *typing.get_args(info.annotation)]
    return any(typing.get_origin(kind) in (list, dict) or kind in (list, dict) for kind in kinds)


def decode(raw: str, info: FieldInfo) -> Any:
    """A raw string value as the field's validator expects it."""
    return json.loads(raw) if _complex(info) else raw


class FlatSource(PydanticBaseSettingsSource):
    """The settings found in ``variables`` (lower-cased names, as pydantic-settings' own
    environment and dotenv sources load them), keyed by flat name."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        variables: Mapping[str, str | None],
        sections: Mapping[str, type[Section]],
    ) -> None:
        super().__init__(settings_cls)
        self._variables = variables
        self._sections = sections

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads flat names itself

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for section in self._sections.values():
            for flat, _name, info in section.flat_fields():
                raw = self._variables.get(PREFIX + flat)
                # Empty is unset (compose's ${NAME:-} gives an empty value for an unset one).
                if raw:
                    found[flat] = decode(raw, info)
        return found


def _flags(sections: Mapping[str, type[Section]]) -> Iterator[tuple[str, str, FieldInfo, str]]:
    for title, section in sections.items():
        for flat, _name, info in section.flat_fields():
            yield title, flat, info, "--" + flat.replace("_", "-")


def parse_flags(argv: list[str], sections: Mapping[str, type[Section]]) -> dict[str, Any]:
    """The settings given as flags in ``argv`` (``--help`` lists every one, by section)."""
    parser = argparse.ArgumentParser(
        prog="python -m service",
        description="The translation service. Every flag is also an environment variable "
        "(--fast-page-size 64 is HYMT_FAST_PAGE_SIZE=64).",
        argument_default=argparse.SUPPRESS,
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for title, flat, info, flag in _flags(sections):
        group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        text = (info.description or "").replace("%", "%%")
        if info.annotation is bool:
            group.add_argument(flag, dest=flat, action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(flag, dest=flat, metavar=flat.upper(), help=text)
    given = vars(parser.parse_args(argv))
    infos = {flat: info for _title, flat, info, _flag in _flags(sections)}
    return {
        flat: decode(value, infos[flat]) if isinstance(value, str) else value
        for flat, value in given.items()
    }
