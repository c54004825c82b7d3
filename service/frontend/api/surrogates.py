"""Lone UTF-16 surrogates in JSON bodies: refused before any route sees them.

JSON may write any UTF-16 code unit as an escape, so ``"\\ud800"`` decodes to a Python string
that cannot be encoded as UTF-8: it reaches hashing, SQLite, logs, msgspec or a tokenizer and
fails there, as a 500 and often before authentication. A surrogate pair (``"\\ud83d\\ude00"``)
is one character and stays (and Python's ``json.dumps`` writes every emoji as such a pair).
Only a body that still holds a surrogate escape once its pairs are taken out is decoded here:
the check costs one regular-expression search on every other body. A surrogate can come as raw
bytes too (``ED A0 80``: UTF-8's form of one, which valid UTF-8 never holds), and Python's
``json.loads`` decodes those as it decodes escapes (``surrogatepass``), so a body holding such
bytes is decoded here as well.
"""

from __future__ import annotations

import json
import re

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# A surrogate's three bytes as UTF-8 would write it (its lead byte and the second one's range).
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")
# A pair's two escapes, after an even run of backslashes (an odd one escapes the first ``\``).
_PAIR = re.compile(rb"(?<!\\)((?:\\\\)*)\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def lone_surrogate(body: bytes) -> str | None:
    """Where a JSON ``body`` holds a string with a lone surrogate (``texts[2]``, ``key``), or
    None when it holds none (or is not JSON at all: the route says what is wrong with it)."""
    raw = _SURROGATE_BYTES.search(body) is not None
    escaped = _SURROGATE_ESCAPE.search(body) is not None
    if not raw and not (escaped and _SURROGATE_ESCAPE.search(_PAIR.sub(rb"\1", body))):
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[str, object]] = [("body", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return where
        elif isinstance(item, dict):
            for key, child in item.items():
                if not _encodable(key):
                    return f"{where} (a key)"
                stack.append((key if where == "body" else f"{where}.{key}", child))
        elif isinstance(item, list):
            stack.extend((f"{where}[{index}]", child) for index, child in enumerate(item))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
