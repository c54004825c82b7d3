"""The messages between the API process and the engine process, and how they are encoded.

msgpack through msgspec: typed structs, tagged so one decoder reads every kind, and no pickle
(a message can never run code). Requests flow API -> engine on one ZeroMQ PUSH/PULL pair,
answers and reports flow engine -> API on another. Ids are integers the API process assigns.

API -> engine: ``Submit`` (a prompt to generate from, with its deadline),
``Cancel`` (the caller went away or gave up), ``Shutdown``, ``Hello`` (a follower API process
started after the engine: it is sent the engine's ``Ready`` again).
Engine -> API: ``Ready`` (loaded and warm enough to take work: what the model is and the
tokenizer the API needs to build prompts), ``LoadFailed``, ``Finished`` and ``Failed`` (one
per submitted request), ``Partial`` (more text of a streamed request), and ``Stats`` every
``stats_interval_s`` from the moment the process starts: its heartbeat and its load.
"""

from __future__ import annotations

import msgspec

from service.contract.tokenizer import TokenizerSpec
from service.contract.types import Decoding, EngineInfo, GenerationResult


class Submit(msgspec.Struct, tag="submit", array_like=True):
    id: int
    prompt_ids: list[int]
    max_new_tokens: int
    decoding: Decoding
    # The deadline, a ``time.monotonic()`` instant: the engine is a process of the API's own
    # host (the sockets are ``ipc://``), where CLOCK_MONOTONIC is one clock for every process,
    # so it drops a request whose deadline passed before the model sees it, even before the
    # API's cancel arrives.
    deadline: float | None = None
    # The engine (its ``Ready.incarnation``) the request was meant for; another drops it: a
    # follower's socket may still hold requests for an engine that has since been restarted.
    # 0: whichever engine receives it (the leader's sockets live as long as one engine).
    incarnation: int = 0
    # Send the text as it grows (``Partial``), where the engine streams.
    stream: bool = False


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    id: int


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


class Hello(msgspec.Struct, tag="hello", array_like=True):
    pass


class Ready(msgspec.Struct, tag="ready", array_like=True):
    info: EngineInfo
    tokenizer: TokenizerSpec
    kind: str
    # Texts the engine generates at once at most (batch size, or requests per step).
    capacity: int
    # Which engine this is (its process id): a new one means the old one's requests are lost.
    incarnation: int = 0
    # Seconds of one decode step by batch size, measured at start (empty: not measured).
    step_seconds: dict[int, float] = {}


class LoadFailed(msgspec.Struct, tag="load_failed", array_like=True):
    message: str


class Finished(msgspec.Struct, tag="finished", array_like=True):
    id: int
    result: GenerationResult
    # Seconds inside the engine before generation started, and generating.
    queue_s: float
    inference_s: float


class Partial(msgspec.Struct, tag="partial", array_like=True):
    """More text of a streamed request: what follows what was sent before (its ``Finished``
    still carries the whole text)."""

    id: int
    text: str


class Failed(msgspec.Struct, tag="failed", array_like=True):
    id: int
    code: str
    message: str


class Stats(msgspec.Struct, tag="stats", array_like=True):
    """The engine's heartbeat and load, as of when it was sent."""

    # Texts received and not yet answered, and of those the ones generating now.
    in_flight: int
    running: int
    # Monotonic counters: texts answered (any outcome) and tokens generated since start.
    answered: int
    generated_tokens: int
    # Accelerator memory by kind (allocated, reserved); empty on CPU or while loading.
    memory: dict[str, int]
    # Model steps taken since start (prefill or decode passes; 0 where the engine does not
    # count them): progress that requests ending at their deadline cannot fake.
    steps: int = 0
    # The share of the wall time since the previous report that the accelerator spent inside
    # the engine's steps (CUDA events around each; None where they are not timed): under load,
    # below 1 the device waited for the host between steps.
    device_busy: float | None = None
    # Seconds the accelerator worked on the engine's steps since start (None where they are
    # not timed), and the host's step loop's seconds since start by part (``LOOP_PARTS``).
    device_seconds: float | None = None
    loop_seconds: dict[str, float] = msgspec.field(default_factory=dict)


# An API process's (requests, results) socket addresses: the engine binds the first and
# connects to the second. The API process that started the engine is the first peer.
Peer = tuple[str, str]

ToEngine = Submit | Cancel | Shutdown | Hello
FromEngine = Ready | LoadFailed | Finished | Partial | Failed | Stats


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def engine_decoder() -> msgspec.msgpack.Decoder[ToEngine]:
    """Decodes what the engine process receives."""
    return msgspec.msgpack.Decoder(ToEngine)


def api_decoder() -> msgspec.msgpack.Decoder[FromEngine]:
    """Decodes what the API process receives."""
    return msgspec.msgpack.Decoder(FromEngine)
