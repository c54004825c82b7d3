"""Texts that come back exactly as they are, without reaching the model: nothing in them is
language (numbers, punctuation, symbols, emoji, whitespace), or all of it is addresses (URLs,
e-mail addresses). A model asked to translate ``12345`` or a URL makes something up; these
cost no admission, no GPU time and no cache entry."""

from __future__ import annotations

import re

_ADDRESS = re.compile(
    r"(?:[a-z][a-z0-9+.-]*://\S+|www\.\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+)\Z", re.IGNORECASE
)


def verbatim(text: str) -> bool:
    """Whether ``text`` is answered as it is."""
    if not any(char.isalpha() for char in text):
        return True
    return all(_ADDRESS.match(word) for word in text.split())
