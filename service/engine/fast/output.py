"""The fast engine's output processor: token ids to text, and answers back to their callers.

Each request's caller (its event loop and callbacks) is held here from intake to its answer. A
streamed request's text grows incrementally: its decoder keeps a read offset and decodes only the
few tokens since it (with a short prefix before them, so that a token whose text depends on the
one before, a leading space or a multi-byte character, decodes as it will in the whole text),
instead of the whole output at every step. Finished requests are decoded in one batch. Answers
and text go back with ``call_soon_threadsafe``: the step loop runs on its own thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from service.contract.errors import ServiceError
from service.contract.types import Completion, GenerationResult, TextSink
from service.engine.fast.scheduler import Finished, Joined
from service.engine.fast.sequence import Sequence as EngineSequence
from service.engine.generation import Detokenizer

# Token ids of a finished request, by request id (what the fidelity checks record).
TokenObserver = Callable[[str, list[int]], None]


class IncrementalText:
    """The text of a growing token sequence, decoded a few tokens at a time."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._tokens: list[int] = []
        self._prefix = 0  # where the window decoded for context starts
        self._read = 0  # tokens up to here are in ``text``
        self.text = ""

    def add(self, token: int) -> bool:
        """Take one more token; whether the text grew."""
        self._tokens.append(token)
        window = self._tokens[self._prefix :]
        before = self._decode(self._tokens[self._prefix : self._read])
        after = self._decode(window)
        # A replacement character at the end: a character whose bytes are not all there yet.
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return False
        self.text += after[len(before) :]
        self._prefix, self._read = self._read, len(self._tokens)
        return True

    def _decode(self, tokens: list[int]) -> str:
        return str(self._tokenizer.decode(tokens, skip_special_tokens=True)) if tokens else ""


@dataclass(slots=True)
class Client:
    """Who waits for a request: where its answer and its text go."""

    loop: asyncio.AbstractEventLoop
    on_done: Completion
    on_text: TextSink | None
    text: IncrementalText | None = None
    sent: str = field(default="")


class OutputProcessor:
    """Answers, failures and streamed text of the requests the engine holds."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eos: frozenset[int],
        observe: TokenObserver | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._detokenizer = Detokenizer(tokenizer, eos)
        self._observe = observe
        self._clients: dict[str, Client] = {}

    def register(self, request_id: str, client: Client) -> None:
        if client.on_text is not None:
            client.text = IncrementalText(self._tokenizer)
        self._clients[request_id] = client

    def forget(self, request_ids: Iterable[str]) -> None:
        """Requests that were cancelled: their callers left, nothing is answered."""
        for request_id in request_ids:
            self._clients.pop(request_id, None)

    def joined(self, joined: Joined) -> None:
        self.forget(joined.dropped)
        self.finish(joined.finished)
        self.stream((sequence.request_id, token) for _, sequence, token in joined.rows)

    def stream(self, pieces: Iterable[tuple[str, int]]) -> None:
        """One new token of each of these requests: their callers get the text when it grew."""
        for request_id, token in pieces:
            client = self._clients.get(request_id)
            if client is None or client.text is None or client.on_text is None:
                continue
            if not client.text.add(token):
                continue
            # The final text is stripped: send only what it will surely begin with.
            sendable = client.text.text.strip()
            if len(sendable) > len(client.sent):
                client.sent = sendable
                client.loop.call_soon_threadsafe(client.on_text, sendable)

    def finish(self, finished: Sequence[Finished]) -> None:
        """Answer finished requests, their texts decoded in one batch."""
        if not finished:
            return
        results = self._detokenizer.results(
            [len(f.sequence.prompt) for f in finished], [f.tokens for f in finished]
        )
        for done, result in zip(finished, results, strict=True):
            if self._observe is not None:
                self._observe(done.sequence.request_id, done.tokens)
            if done.sequence.reused:
                result = dataclasses.replace(result, cached_tokens=done.sequence.reused)
            self.answer(done.sequence, result)

    def answer(self, sequence: EngineSequence, outcome: GenerationResult | ServiceError) -> None:
        """Send ``outcome`` to the request's caller with its time queued and its time running."""
        client = self._clients.pop(sequence.request_id, None)
        if client is None:
            return
        now = time.monotonic()
        started = sequence.started or now
        queued, ran = max(0.0, started - sequence.submitted), max(0.0, now - started)
        client.loop.call_soon_threadsafe(client.on_done, outcome, queued, ran)

    def fail(self, sequences: Iterable[EngineSequence], error: ServiceError) -> None:
        for sequence in sequences:
            self.answer(sequence, error)
