"""The configuration reference (``docs/configuration.md``), written from the settings
themselves so that it cannot drift: ``python -m service.config.reference > docs/configuration.md``
(a test checks the file is what this prints)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from service.config.settings import Settings

_INTRO = """# Configuration reference

Every setting is an environment variable (`HYMT_<NAME>`), a line of a `.env` file in the working
directory, or a flag of `python -m service` (`--<name>` in kebab case), in that order of
precedence: a flag wins over the environment, which wins over `.env`. An empty value counts as
unset. Lists are JSON (`HYMT_API_KEYS='["k1","k2"]'`). `python -m service --help` prints the same
list. In code the settings are grouped by concern (`settings.engine.page_size` is
`HYMT_FAST_PAGE_SIZE`); this page is written from them
(`python -m service.config.reference > docs/configuration.md`).
"""


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, Path):
            return f"`{str(value).replace(str(Path.home()), '~')}`"
        return f"`{json.dumps(value)}`"
    if info.default is PydanticUndefined or info.default is None:
        return "unset"
    if info.default == "":
        return '`""`'
    if isinstance(info.default, bool):
        return f"`{str(info.default).lower()}`"
    return f"`{info.default}`"


def render() -> str:
    lines = [_INTRO]
    for title, section in Settings.SECTIONS.items():
        lines += [f"## {title}", "", "| Variable | Default | What it does |", "|---|---|---|"]
        for flat, _name, info in section.flat_fields():
            text = (info.description or "").replace("|", "\\|")
            lines.append(f"| `HYMT_{flat.upper()}` | {_default(info)} | {text} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
