"""One API process's two ZeroMQ sockets to an engine process, and the requests in flight on them.

Shared by ``EngineClient`` (the process that started the engine) and ``EngineFollower`` (a
follower API process): requests are sent synchronously on a PUSH socket (never blocking: no
high-water mark, admission bounds what is in flight), answers arrive on a PULL socket read from
the event loop, and each request's future is resolved by its ``Finished`` or ``Failed``.
"""

from __future__ import annotations

import asyncio
import itertools

import zmq
import zmq.asyncio

from service.contract.errors import EngineUnavailable, ServiceError, error_of
from service.contract.protocol import (
    Cancel,
    Failed,
    Finished,
    FromEngine,
    Hello,
    Partial,
    Shutdown,
    Submit,
    api_decoder,
    encoder,
)
from service.contract.types import GenerationRequest, Scheduled, TextSink


class EngineChannel:
    """Sockets to one engine's addresses, request ids, and the futures of answers to come."""

    def __init__(self) -> None:
        self._sync_context = zmq.Context()
        self._context = zmq.asyncio.Context()
        self._requests = self._sync_context.socket(zmq.PUSH)
        self._results = self._context.socket(zmq.PULL)
        for socket in (self._requests, self._results):
            socket.setsockopt(zmq.SNDHWM, 0)
            socket.setsockopt(zmq.RCVHWM, 0)
        self._encoder = encoder()
        self._decoder = api_decoder()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Scheduled]] = {}
        # Streamed requests' sinks for their ``Partial`` texts, while in flight.
        self._streams: dict[int, TextSink] = {}

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    def open(self, requests_address: str, results_address: str) -> None:
        # The engine binds the requests socket and this side connects: a connecting PUSH
        # queues from the start, where a bound one refuses to send until the engine's
        # connection is registered, which can be after its ``Ready`` arrived on the other socket.
        self._requests.connect(requests_address)
        self._results.bind(results_address)

    def submit(
        self,
        request: GenerationRequest,
        deadline: float | None,
        incarnation: int = 0,
        on_text: TextSink | None = None,
    ) -> tuple[int, asyncio.Future[Scheduled]]:
        """Send ``request``; the future resolves with its answer or the error of its failure.
        ``on_text`` gets each piece of text the engine streams before its answer."""
        request_id = next(self._ids)
        future: asyncio.Future[Scheduled] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if on_text is not None:
            self._streams[request_id] = on_text
        self.send(
            Submit(
                id=request_id,
                prompt_ids=list(request.prompt_ids),
                max_new_tokens=request.max_new_tokens,
                decoding=request.decoding,
                deadline=deadline,
                incarnation=incarnation,
                stream=on_text is not None,
            )
        )
        return request_id, future

    def forget(self, request_id: int) -> bool:
        """Stop waiting for ``request_id``; whether it was still in flight."""
        self._streams.pop(request_id, None)
        return self._pending.pop(request_id, None) is not None

    def fail_all(self, error: ServiceError) -> None:
        """Answer every request in flight with ``error`` (shutdown, death, restart)."""
        pending, self._pending = self._pending, {}
        self._streams.clear()
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    def send(self, message: Submit | Cancel | Shutdown | Hello) -> None:
        try:
            self._requests.send(self._encoder.encode(message), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise EngineUnavailable("the engine is not reachable") from None

    async def receive(self) -> FromEngine:
        """The next message from the engine, once an answer among them has resolved its future."""
        message = self._decoder.decode(await self._results.recv())
        if isinstance(message, Partial):
            sink = self._streams.get(message.id)
            if sink is not None:
                sink(message.text)
        elif isinstance(message, Finished | Failed):
            self._streams.pop(message.id, None)
            future = self._pending.pop(message.id, None)
            if future is not None and not future.done():
                if isinstance(message, Finished):
                    future.set_result(
                        Scheduled(message.result, message.queue_s, message.inference_s)
                    )
                else:
                    future.set_exception(error_of(message.code, message.message))
        return message

    def close(self) -> None:
        self._requests.close(linger=0)
        self._results.close(linger=0)
        self._context.term()
        self._sync_context.term()
