"""The host's side of the decode rows: each row's request and the counts the step loop reads,
as numpy arrays over the rows, so that a step costs the host a few array operations whatever the
batch size. ``batch.DeviceRows`` is the same rows on the device.
"""

from __future__ import annotations

import numpy as np

from service.engine.fast.sequence import Sequence


class HostRows:
    def __init__(self, rows: int, max_new_tokens: int) -> None:
        # Position the row's next token is written at (advanced when a step is launched).
        self.length = np.zeros(rows, dtype=np.int64)
        # Tokens generated and read back so far, and the most the request may have.
        self.count = np.zeros(rows, dtype=np.int64)
        self.budget = np.zeros(rows, dtype=np.int64)
        self.streams = np.zeros(rows, dtype=bool)
        self.full_sort = np.zeros(rows, dtype=bool)
        self.generated = np.zeros((rows, max_new_tokens + 1), dtype=np.int64)
        self.owner: list[Sequence | None] = [None] * rows

    @property
    def max_new_tokens(self) -> int:
        """The most tokens a row may generate."""
        return int(self.generated.shape[1]) - 1

    def join(self, row: int, sequence: Sequence, first_token: int) -> None:
        self.owner[row] = sequence
        self.length[row] = len(sequence.prompt)
        self.count[row] = 1
        self.generated[row, 0] = first_token
        self.budget[row] = sequence.max_new
        self.streams[row] = sequence.streams
        self.full_sort[row] = sequence.parameters.full_sort

    def tokens(self, row: int) -> list[int]:
        return [int(t) for t in self.generated[row, : self.count[row]]]

    def held(self, row: int) -> Sequence:
        owner = self.owner[row]
        assert owner is not None, f"row {row} holds no request"
        return owner

    def move(self, holes: list[int], movers: list[int]) -> None:
        """Rows ``movers`` take the places ``holes``."""
        if not holes:
            return
        for array in (self.length, self.count, self.budget, self.streams, self.full_sort):
            array[holes] = array[movers]
        self.generated[holes] = self.generated[movers]
        for hole, mover in zip(holes, movers, strict=True):
            self.owner[hole] = self.owner[mover]

    def clear(self, start: int, end: int) -> None:
        for row in range(start, end):
            self.owner[row] = None
        self.streams[start:end] = False
        self.full_sort[start:end] = False
