"""Kept prompt prefixes (``prefix_cache.py``) through the scheduler, with a fake cache: no model.

The fake cache holds, per slot, what a real one's keys and values there depend on: the prompt
tokens up to and with that position (keys are a function of the prefix before them, and of the
position, which a kept block keeps). Each step writes what its chunks compute, then makes the
step's copies as one gather-then-scatter, as each layer does on the device. A prompt's slots
must then hold its own prefix at every position its attention reads, whatever was reused, kept,
evicted or freed and reused by others before.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine.fast.pages import PageManager, slots_of
from service.engine.fast.prefix_cache import PREFIX_BLOCK, PrefixCache
from service.engine.fast.scheduler import Chunk, Scheduler
from service.engine.fast.sequence import RowParameters, Sequence

EOS = 0
PAGE = 16
GREEDY = RowParameters(True, 1.0, 1, 1.0, 1.0)


class FakeCache:
    """Slot -> the prompt prefix its keys and values were computed from."""

    def __init__(self) -> None:
        self.slots: dict[int, tuple[int, ...]] = {}

    def run(self, chunks: list[Chunk]) -> None:
        """One prefill step: its tokens written, then its copies made."""
        sources, targets = [], []
        for chunk in chunks:
            prompt, pages = chunk.sequence.prompt, chunk.sequence.pages
            span = np.arange(chunk.start, chunk.start + chunk.count)
            for position, slot in zip(span, slots_of(pages, span, PAGE), strict=True):
                self.slots[int(slot)] = prompt[: position + 1]
            reuse = chunk.reuse
            if reuse is not None:
                sources += [reuse.into, slots_of(pages, reuse.out_positions, PAGE)]
                targets += [slots_of(pages, np.arange(reuse.tokens), PAGE), reuse.out_slots]
        source = np.concatenate(sources).tolist() if sources else []
        target = np.concatenate(targets).tolist() if targets else []
        # One index_copy_ of an index_select: its reads and writes must not overlap.
        assert not set(source) & set(target)
        assert len(set(target)) == len(target)
        values = [self.slots.get(slot, ()) for slot in source]
        self.slots.update(zip(target, values, strict=True))

    def holds(self, sequence: Sequence, upto: int) -> bool:
        """Whether the sequence's first ``upto`` positions hold its own prefix."""
        slots = slots_of(sequence.pages, np.arange(upto), PAGE).tolist()
        return all(self.slots.get(s) == sequence.prompt[: p + 1] for p, s in enumerate(slots))


def scheduler(rows: int, prefill: int, pages: int, kept_tokens: int) -> Scheduler:
    manager = PageManager(pages)
    return Scheduler(
        rows=rows,
        prefill_tokens=prefill,
        pages=manager,
        page_size=PAGE,
        max_positions=512,
        max_new_tokens=8,
        eos=[EOS],
        prefixes=PrefixCache.reserve(manager, PAGE, kept_tokens),
    )


def sequence(name: str, prompt: tuple[int, ...]) -> Sequence:
    return Sequence(name, prompt, max_new=2, parameters=GREEDY, streams=False, submitted=0.0)


def drive(chosen: Scheduler, cache: FakeCache, prompts: list[tuple[int, ...]]) -> int:
    """Every prompt prefilled, each completed prompt checked and then finished at once (its
    pages freed for the next); the prompt tokens reused."""
    for index, prompt in enumerate(prompts):
        assert chosen.add(sequence(f"r{index}", prompt)) is None
    steps = 0
    while chosen.has_work():
        steps += 1
        assert steps <= sum(map(len, prompts)) + 1
        chunks = chosen.schedule_prefill()
        assert chunks, "a prompt waits with nothing running"
        cache.run(chunks)
        for chunk in chunks:
            # What this chunk's attention reads: every position up to its end.
            assert cache.holds(chunk.sequence, chunk.start + chunk.count)
        done = [c.sequence for c in chunks if c.completes]
        for chunk in chunks:
            if chunk.completes:
                assert chunk.count >= 1  # the last token is always prefilled: its logits
        chosen.join(done, [EOS] * len(done))
    assert chosen.pages.committed == 0
    kept = chosen.prefixes
    assert kept is not None
    assert len(kept) + kept.free == kept.capacity  # no block lost
    return kept.reused_tokens


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], int, int, int]:
    # A few shared heads (templates, repeated texts) and random tails, from a small alphabet
    # so that tails collide too.
    heads = draw(st.lists(st.lists(st.integers(1, 4), max_size=40), min_size=1, max_size=4))
    prompts = []
    for _ in range(draw(st.integers(1, 24))):
        head = draw(st.sampled_from(heads))
        tail = draw(st.lists(st.integers(1, 4), min_size=1 if not head else 0, max_size=30))
        prompts.append(tuple(head + tail))
    rows = draw(st.integers(1, 6))
    prefill = draw(st.integers(1, 96))
    kept = draw(st.sampled_from([PAGE, 2 * PAGE, 4 * PAGE]))
    return prompts, rows, prefill, kept


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_every_prompt_reads_its_own_prefix_whatever_was_reused_or_kept(
    workload: tuple[list[tuple[int, ...]], int, int, int],
) -> None:
    prompts, rows, prefill, kept = workload
    cache = FakeCache()
    drive(scheduler(rows, prefill, pages=64, kept_tokens=kept), cache, prompts)


def test_a_prefix_is_kept_when_seen_again_and_reused_from_then_on() -> None:
    template = tuple(range(1, 3 * PREFIX_BLOCK + 4))  # three blocks and a bit
    prompts = [(*template, 100 + index, 200 + index) for index in range(4)]
    chosen = scheduler(rows=4, prefill=40, pages=64, kept_tokens=2 * PAGE)
    cache = FakeCache()
    # One prompt a step: the first is seen, the second keeps the blocks, the rest reuse them.
    reused = [drive(chosen, cache, [prompt]) for prompt in prompts]
    assert reused == [0, 0, 3 * PREFIX_BLOCK, 6 * PREFIX_BLOCK]


def test_a_long_prompt_keeps_the_blocks_of_every_chunk() -> None:
    prompt = tuple(range(1, 5 * PREFIX_BLOCK + 1))  # 40 tokens in chunks of 12
    chosen = scheduler(rows=2, prefill=12, pages=64, kept_tokens=4 * PAGE)
    cache = FakeCache()
    reused = [drive(chosen, cache, [prompt]) for _ in range(3)]
    # All but the block of its last token, though no chunk held more than one whole block.
    assert reused == [0, 0, 4 * PREFIX_BLOCK]


def test_a_whole_prompt_of_kept_blocks_still_prefills_its_last_token() -> None:
    prompt = tuple(range(1, 2 * PREFIX_BLOCK + 1))  # exactly two blocks
    chosen = scheduler(rows=2, prefill=64, pages=64, kept_tokens=PAGE)
    cache = FakeCache()
    for _ in range(3):
        drive(chosen, cache, [prompt])
    assert chosen.prefixes is not None
    assert chosen.prefixes.reused_tokens == PREFIX_BLOCK  # the first block; the last token's
    # block is prefilled again


def test_a_failed_step_forgets_what_it_kept() -> None:
    prompt = tuple(range(1, 3 * PREFIX_BLOCK + 2))
    chosen = scheduler(rows=2, prefill=64, pages=64, kept_tokens=2 * PAGE)
    cache = FakeCache()
    drive(chosen, cache, [prompt, prompt])
    assert chosen.prefixes is not None
    assert len(chosen.prefixes) == 3
    chosen.add(sequence("x", prompt))
    chosen.schedule_prefill()  # reuses the kept blocks; then the step fails
    chosen.fail_all()
    assert len(chosen.prefixes) == 0
    before = chosen.prefixes.reused_tokens
    # A cache that lost everything: a reuse would read nothing there.
    assert drive(chosen, FakeCache(), [prompt]) == before


def test_kept_pages_are_no_request_s_and_off_is_none() -> None:
    manager = PageManager(64)
    kept = PrefixCache.reserve(manager, PAGE, 3 * PAGE)
    assert kept is not None
    assert kept.capacity == 3 * PAGE // PREFIX_BLOCK
    assert manager.usable == 63 - 3
    assert PrefixCache.reserve(PageManager(64), PAGE, 0) is None
    # Unset: the default, but at most a sixteenth of the cache.
    small = PageManager(40)
    assert PrefixCache.reserve(small, PAGE, None) is not None
    assert small.usable == 39 - 2
