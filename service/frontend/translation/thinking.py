"""Think blocks taken out of answers: Hy-MT2-30B-A3B was trained on answers that always begin
with ``<think>...</think>`` (empty or not); a translation is what follows the block.

``without_thoughts`` does it for a whole answer, ``ThoughtFilter`` for one streamed piece by
piece (text is held back only while it may still be the start of a block).
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def without_thoughts(text: str) -> str:
    """``text`` without a leading think block and the whitespace after it; an answer whose
    block never closes is returned as it is (the length budget ran out while thinking)."""
    stripped = text.lstrip()
    if not stripped.startswith(OPEN):
        return text
    end = stripped.find(CLOSE)
    if end < 0:
        return text
    return stripped[end + len(CLOSE) :].lstrip()


class ThoughtFilter:
    """Streamed pieces in, the pieces of the answer without its leading think block out."""

    def __init__(self) -> None:
        self._held = ""
        # "start": undecided; "block": inside the think block; "after": whitespace after it
        # is dropped; "pass": everything goes through.
        self._state = "start"

    def feed(self, piece: str) -> str:
        """What of ``piece`` (and of what was held) can be sent now."""
        if self._state == "pass":
            return piece
        if self._state == "after":
            rest = piece.lstrip()
            if rest:
                self._state = "pass"
            return rest
        self._held += piece
        head = self._held.lstrip()
        if self._state == "start":
            if len(head) < len(OPEN) and OPEN.startswith(head):
                return ""  # perhaps the opening tag, not all there yet
            if not head.startswith(OPEN):
                self._state = "pass"
                held, self._held = self._held, ""
                return held
            self._state = "block"
        end = head.find(CLOSE)
        if end < 0:
            return ""
        self._held = ""
        self._state = "after"
        return self.feed(head[end + len(CLOSE) :])

    def rest(self) -> str:
        """What is still held when the answer ends: a block that never closed, as it was."""
        held, self._held = self._held, ""
        return held if self._state in ("start", "block") else ""
