"""The garbage collector's settings for a long-lived serving process (API and engine alike).

What start-up built (modules, the app and its schemas, the tokenizer, the model) lives as long
as the process, so ``tune_collector`` freezes it out of the collector's sight once the process is
ready. And under a flood thousands of requests' objects are alive at once: with the default
thresholds a collection starts every 700 allocations and a full pass every second or so, each
scanning all of them for nothing (pauses of the event loop; the figures are in
``docs/benchmarks.md``). Reference cycles are still collected.
"""

from __future__ import annotations

import gc

_GEN0_THRESHOLD = 50_000
_GEN1_THRESHOLD = 50
_GEN2_THRESHOLD = 100


def tune_collector() -> None:
    """Freeze what exists now and make collections rarer (call once, when ready)."""
    gc.freeze()
    gc.set_threshold(_GEN0_THRESHOLD, _GEN1_THRESHOLD, _GEN2_THRESHOLD)
