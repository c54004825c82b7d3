"""An API process's open files (its connections among them): the limit raised and the kernel's
table of them grown once, at start, before any connection comes.

Linux keeps a process's open files in a table that doubles as it fills (64, 128, 256, ...
entries). In a process with more than one thread, as an API process is (its thread pool, the
engine link's), each doubling waits for an RCU grace period, and the event loop, which is the
thread accepting, waits with it: a flood of new connections into a freshly started process
stalled at its 256th connection and again at its 512th, every connection behind them waiting.
The table never shrinks, so grown once at start no flood pays for it again. The soft limit is
raised towards the same count first (as nginx's ``worker_rlimit_nofile`` does): at a soft
limit of 1,024, common on hosts and in containers, a flood's 1,025th connection would not be
accepted at all.
"""

from __future__ import annotations

import fcntl
import os
import resource
from dataclasses import dataclass

# Wanted where the operator names no count: enough for every connection a flood brings one
# process (capped by the hard limit); the kernel's table of this many takes half a megabyte.
DEFAULT_OPEN_FILES = 65_536


@dataclass(frozen=True, slots=True)
class OpenFiles:
    """What the process may open: ``limit``, its soft limit now (None: unlimited), and
    ``table``, the entries its table holds without growing (at least ``wanted`` unless the
    limit is lower)."""

    limit: int | None
    table: int


def reserve_open_files(wanted: int) -> OpenFiles:
    """Raise the soft limit of open files to ``wanted`` (never above the hard limit, never
    lowered) and grow the table to hold that many."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft != unlimited and soft < wanted:
        raised = wanted if hard == unlimited else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass  # a system cap under the hard limit (macOS's OPEN_MAX): the limit stays
    top = wanted if soft == unlimited else min(wanted, soft)
    _grow_table(top)
    return OpenFiles(None if soft == unlimited else soft, top)


def _grow_table(entries: int) -> None:
    """Make the table hold ``entries`` descriptors: one duplicated at the highest of them (the
    lowest free one from there, so that none open is touched), then closed again."""
    if entries < 2:
        return
    probe = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        high = fcntl.fcntl(probe, fcntl.F_DUPFD_CLOEXEC, entries - 1)
        os.close(high)
    except OSError:
        pass  # every descriptor from there is taken or over the limit: nothing left to grow
    finally:
        os.close(probe)
