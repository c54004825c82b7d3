"""The fast engine's scheduler: which requests wait, which prefill, which hold a decode row, and
what each step runs.

Plain Python and numpy, no torch. The step loop asks it for a plan (``schedule_prefill``,
``schedule_decode``), the model runner carries the plan out on the device, and the scheduler
takes the sampled tokens back (``join``, ``update``, ``retire``): vLLM v1's schedule, execute and
update-from-output. What the device must change (rows that join, pages a row takes, rows packed
down when others finish, pages given back) comes back as data for the runner to write.

Admission commits a request's KV pages for its prompt and its whole token budget, so an admitted
request always completes; a request waits while the rows or the cache are full. A prefill step
takes whole prompts, or a chunk of a long one, up to ``prefill_tokens`` tokens, so that a long
prompt never holds the running decodes back for more than a chunk. A prompt that starts with
kept prefix blocks (``prefix_cache.py``) is prefilled from the end of them, their keys and values
copied in. A request whose deadline passed while it waited is dropped when its turn comes
(``take_expired``): its caller has been answered, so it must not cost the model anything.
Rows ``0..n-1`` hold the running requests; when some finish, the last rows move into their
places.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from service.contract.errors import InvalidInput, OutOfMemory, ServiceError
from service.engine.fast.host_rows import HostRows
from service.engine.fast.pages import PageManager, pages_for
from service.engine.fast.prefix_cache import PrefixCache, Reuse
from service.engine.fast.sequence import Sequence


@dataclass(frozen=True, slots=True)
class Chunk:
    """``count`` tokens of a prompt from ``start``, to prefill this step (its pages taken), and
    the kept prefix blocks its first chunk reuses and keeps."""

    sequence: Sequence
    start: int
    count: int
    reuse: Reuse | None = None

    @property
    def completes(self) -> bool:
        return self.start + self.count == len(self.sequence.prompt)


@dataclass(slots=True)
class PageOwners:
    """Device-table writes: page ``pages[i]`` is page ``logical[i]`` of decode row ``rows[i]``."""

    pages: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    logical: list[int] = field(default_factory=list)

    def add(self, row: int, pages: list[int]) -> None:
        """All of a row's pages, in order."""
        self.pages.extend(pages)
        self.rows.extend([row] * len(pages))
        self.logical.extend(range(len(pages)))


@dataclass(frozen=True, slots=True)
class Finished:
    """A request done: its generated tokens (an end-of-sequence token included)."""

    sequence: Sequence
    tokens: list[int]


@dataclass(slots=True)
class Joined:
    """Prompts whose prefill ended: those that took a row (``rows``: row, request, first token),
    those done at their first token, and those cancelled meanwhile (``dropped``, no answer)."""

    rows: list[tuple[int, Sequence, int]] = field(default_factory=list)
    owners: PageOwners = field(default_factory=PageOwners)
    finished: list[Finished] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """One decode step over rows ``0..rows-1``, and the pages rows take for it."""

    rows: int
    full_sort: bool
    grown: PageOwners
    # The longest sequence after this step: what an eager step's attention reads.
    longest: int


@dataclass(slots=True)
class Update:
    """What one step's tokens did: the rows they finished, and the tokens of streaming rows."""

    finished: set[int] = field(default_factory=set)
    streamed: list[tuple[str, int]] = field(default_factory=list)


@dataclass(slots=True)
class Retired:
    """Finished rows taken out: ``movers`` moved into ``holes``, rows ``keep..old_n-1`` cleared,
    the moved rows' pages re-owned, the finished requests' pages freed."""

    holes: list[int] = field(default_factory=list)
    movers: list[int] = field(default_factory=list)
    keep: int = 0
    old_n: int = 0
    owners: PageOwners = field(default_factory=PageOwners)
    finished: list[Finished] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)

    def remap(self, tokens: np.ndarray) -> tuple[np.ndarray, int]:
        """A step's tokens read in the rows as they were before this move, as the rows are
        after it: the movers' tokens in the holes, the finished rows' dropped."""
        kept = tokens[: self.keep].copy()
        kept[self.holes] = tokens[self.movers]
        return kept, self.keep


class Scheduler:
    """Waiting, prefilling and running requests over ``rows`` decode rows and ``pages``."""

    def __init__(
        self,
        rows: int,
        prefill_tokens: int,
        pages: PageManager,
        page_size: int,
        max_positions: int,
        max_new_tokens: int,
        eos: Iterable[int],
        prefixes: PrefixCache | None = None,
    ) -> None:
        self.pages = pages
        self.prefixes = prefixes
        self.rows = HostRows(rows, max_new_tokens)
        self._max_rows = rows
        self._prefill_tokens = prefill_tokens
        self._page = page_size
        self._max_positions = max_positions
        self._eos_set = frozenset(eos)
        self._eos = np.array(sorted(self._eos_set), dtype=np.int64)
        self._n = 0
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._prefilling: collections.deque[Sequence] = collections.deque()
        self._by_id: dict[str, Sequence] = {}
        self._cancelled_rows = False
        self._expired: list[Sequence] = []

    # --- state ---------------------------------------------------------------------------

    @property
    def decoding(self) -> int:
        """Rows holding a running request."""
        return self._n

    @property
    def running(self) -> int:
        """Requests admitted and not finished: decoding or prefilling."""
        return self._n + len(self._prefilling)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def has_work(self) -> bool:
        return bool(self._waiting or self._prefilling or self._n)

    # --- requests in and out -------------------------------------------------------------

    def add(self, sequence: Sequence) -> ServiceError | None:
        """Queue ``sequence`` (its budget cut to the rows' most); the error refusing it instead
        when it can never run."""
        sequence.max_new = max(1, min(sequence.max_new, self.rows.max_new_tokens))
        if not sequence.prompt:
            return InvalidInput("an empty prompt")
        total = len(sequence.prompt) + sequence.max_new
        if total > self._max_positions:
            return InvalidInput(
                f"prompt and output of {total} tokens exceed the model's "
                f"{self._max_positions} positions"
            )
        if pages_for(total, self._page) > self.pages.usable:
            return OutOfMemory("the request needs more KV cache than this engine holds")
        self._by_id[sequence.request_id] = sequence
        self._waiting.append(sequence)
        return None

    def cancel(self, request_ids: Iterable[str]) -> list[str]:
        """Mark these requests cancelled; those still waiting are dropped at once (returned),
        those admitted leave at their next step."""
        cancelled: set[str] = set()
        for request_id in request_ids:
            held = self._by_id.get(request_id)
            if held is not None and not held.cancelled:
                held.cancelled = True
                cancelled.add(request_id)
        if not cancelled:
            return []
        self._cancelled_rows = True
        dropped = [s.request_id for s in self._waiting if s.cancelled]
        if dropped:
            self._waiting = collections.deque(s for s in self._waiting if not s.cancelled)
            for request_id in dropped:
                del self._by_id[request_id]
        return dropped

    # --- prefill ---------------------------------------------------------------------------

    def schedule_prefill(self) -> list[Chunk]:
        """This step's prefill: the prompt being chunked first, then waiting prompts admitted in
        order while rows and pages allow, up to ``prefill_tokens`` tokens. Pages are taken."""
        budget = self._prefill_tokens
        chunks: list[Chunk] = []
        completing = 0  # prompts of this step that take a row when it ends
        if self.prefixes is not None:
            self.prefixes.next_step()
        while budget > 0:
            reuse = None
            if self._prefilling and (not chunks or chunks[-1].sequence is not self._prefilling[0]):
                sequence = self._prefilling[0]
            elif self._waiting and self._expires(self._waiting[0]):
                continue
            elif self._waiting and self._admit(self._waiting[0], completing):
                sequence = self._waiting.popleft()
                self._prefilling.append(sequence)
                if self.prefixes is not None:
                    reuse = self.prefixes.admit(sequence.prompt, budget)
                    sequence.prefilled = sequence.reused = reuse.tokens
            else:
                break
            start = sequence.prefilled
            count = min(budget, len(sequence.prompt) - start)
            if reuse is None and self.prefixes is not None:  # a later chunk of a long prompt
                reuse = self.prefixes.keep(sequence.prompt, start, start + count)
            while len(sequence.pages) < pages_for(start + count, self._page):
                sequence.pages.append(self.pages.take())
            sequence.prefilled = start + count
            chunks.append(Chunk(sequence, start, count, reuse))
            budget -= count
            if not chunks[-1].completes:
                break
            self._prefilling.popleft()
            completing += 1
        return chunks

    def take_expired(self) -> list[Sequence]:
        """Waiting requests dropped since the last call because their deadline passed first,
        to be answered ``DeadlineExceeded``."""
        expired, self._expired = self._expired, []
        return expired

    def _expires(self, sequence: Sequence) -> bool:
        """Drop the first waiting request if its deadline has passed: checked at its admission,
        so that none reaches the model after its caller was answered (the API's cancel may
        still be on its way)."""
        if sequence.deadline is None or sequence.deadline > time.monotonic():
            return False
        self._waiting.popleft()
        del self._by_id[sequence.request_id]
        self._expired.append(sequence)
        return True

    def _admit(self, sequence: Sequence, completing: int) -> bool:
        if self._n + len(self._prefilling) + completing >= self._max_rows:
            return False
        need = pages_for(len(sequence.prompt) + sequence.max_new, self._page)
        if not self.pages.can_commit(need):
            return False
        self.pages.commit(need)
        sequence.committed = need
        sequence.started = time.monotonic()
        return True

    def join(self, completing: list[Sequence], first_tokens: list[int]) -> Joined:
        """Prompts whose prefill ended, with their first tokens: each takes the next free row,
        or ends here (an end-of-sequence token, a budget of one, a cancel)."""
        joined = Joined()
        for sequence, token in zip(completing, first_tokens, strict=True):
            if sequence.cancelled:
                joined.freed.extend(self._release(sequence))
                joined.dropped.append(sequence.request_id)
            elif token in self._eos_set or sequence.max_new == 1:
                joined.freed.extend(self._release(sequence))
                joined.finished.append(Finished(sequence, [token]))
            else:
                row = self._n
                self._n += 1
                self.rows.join(row, sequence, token)
                joined.rows.append((row, sequence, token))
                joined.owners.add(row, sequence.pages)
        return joined

    # --- decode ----------------------------------------------------------------------------

    def schedule_decode(self) -> DecodePlan | None:
        """The next decode step over the running rows, each given the page its next position
        needs; ``None`` when no row runs. Counts the step's position as written."""
        n, host = self._n, self.rows
        if not n:
            return None
        grown = PageOwners()
        for row in np.nonzero(host.length[:n] % self._page == 0)[0].tolist():
            sequence = host.held(row)
            taken = self.pages.take()
            grown.pages.append(taken)
            grown.rows.append(row)
            grown.logical.append(len(sequence.pages))
            sequence.pages.append(taken)
        full = bool(host.full_sort[:n].any())
        longest = int(host.length[:n].max()) + 1
        host.length[:n] += 1
        return DecodePlan(rows=n, full_sort=full, grown=grown, longest=longest)

    def update(self, rows: int, tokens: np.ndarray) -> Update:
        """Take a step's ``tokens`` (one per row of its first ``rows`` rows) into the rows;
        what finished and what streams."""
        host = self.rows
        every = np.arange(rows)
        host.generated[every, host.count[:rows]] = tokens[:rows]
        host.count[:rows] += 1
        done = np.isin(tokens[:rows], self._eos) | (host.count[:rows] >= host.budget[:rows])
        streaming = np.nonzero(host.streams[:rows] & ~done)[0].tolist()
        update = Update(
            finished=set(np.nonzero(done)[0].tolist()),
            streamed=[(host.held(row).request_id, int(tokens[row])) for row in streaming],
        )
        if self._cancelled_rows:
            # Rare: a scan of the rows only when a running request was cancelled.
            self._cancelled_rows = False
            update.finished.update(row for row in range(rows) if host.held(row).cancelled)
        return update

    def retire(self, finished: list[int]) -> Retired:
        """Take the ``finished`` rows out: the last rows move into their places."""
        n, host = self._n, self.rows
        outcomes = [(host.held(row), host.tokens(row)) for row in finished]
        keep = n - len(finished)
        gone = set(finished)
        holes = [row for row in finished if row < keep]
        movers = [row for row in range(keep, n) if row not in gone]
        host.move(holes, movers)
        host.clear(keep, n)
        self._n = keep
        retired = Retired(holes=holes, movers=movers, keep=keep, old_n=n)
        for hole in holes:
            retired.owners.add(hole, host.held(hole).pages)
        for sequence, tokens in outcomes:
            retired.freed.extend(self._release(sequence))
            if sequence.cancelled:
                retired.dropped.append(sequence.request_id)
            else:
                retired.finished.append(Finished(sequence, tokens))
        return retired

    def fail_all(self) -> tuple[Retired, list[Sequence]]:
        """Everything the scheduler holds let go (a step failed): the rows to clear, and every
        request that was not cancelled, to be answered with the failure."""
        everyone = list(self._by_id.values())
        if self.prefixes is not None:
            self.prefixes.clear()  # the failed step may not have written what it kept
        retired = Retired(keep=0, old_n=self._n)
        self.rows.clear(0, self._max_rows)
        self._n = 0
        self._prefilling.clear()
        self._waiting.clear()
        for sequence in everyone:
            retired.freed.extend(self._release(sequence))
            if sequence.cancelled:
                retired.dropped.append(sequence.request_id)
        return retired, [s for s in everyone if not s.cancelled]

    def _release(self, sequence: Sequence) -> list[int]:
        """Give back a request's pages and commitment; the pages it held."""
        pages = sequence.pages
        self.pages.release(pages, sequence.committed)
        sequence.pages = []
        sequence.committed = 0
        self._by_id.pop(sequence.request_id, None)
        return pages
