"""Dispatch: one generation request to the engine, under its deadline, with its metrics.

The translator's view of generation (a ``Generator``): ``generate`` sends a request to the
current engine and waits for its answer until the deadline; a deadline that passes or a caller
that goes away cancels the request in the engine. Every answer is counted once here, with one
meaning whichever engine runs: queue wait (sent to the engine until its generation started),
generation time, tokens, failures by code.
"""

from __future__ import annotations

import asyncio
import time

from service.contract.errors import DeadlineExceeded, EngineUnavailable, ServiceError
from service.contract.types import GenerationRequest, Scheduled, TextSink
from service.frontend.metrics import Metrics
from service.frontend.policy.admission import Admission
from service.frontend.policy.following import Supervision


class Dispatcher:
    """Sends generation requests to the supervised engine."""

    def __init__(self, supervisor: Supervision, admission: Admission, metrics: Metrics) -> None:
        self._supervisor = supervisor
        self._admission = admission
        self._metrics = metrics

    async def generate(
        self,
        request: GenerationRequest,
        deadline: float | None = None,
        on_text: TextSink | None = None,
    ) -> Scheduled:
        """The result of ``request``, or its typed error; ``DeadlineExceeded`` past ``deadline``.
        ``on_text`` gets each piece of text the engine streams before the result."""
        client = self._supervisor.working_client()
        if client is None:
            raise self._supervisor.availability() or EngineUnavailable("no engine is running")
        sent = time.monotonic()
        timeout = None if deadline is None else deadline - sent
        if timeout is not None and timeout <= 0:
            self._metrics.queue_rejections.labels(reason="deadline").inc()
            raise DeadlineExceeded("the request's deadline passed before it reached the engine")
        request_id, future = client.submit(request, deadline, on_text)
        try:
            answer = await (future if timeout is None else asyncio.wait_for(future, timeout))
        except TimeoutError:
            client.cancel(request_id)
            self._metrics.queue_rejections.labels(reason="deadline").inc()
            self._admission.completed()
            raise DeadlineExceeded("the request's deadline passed before it finished") from None
        except DeadlineExceeded:
            # The engine, which has the same deadline, saw it pass first: the same outcome.
            self._metrics.queue_rejections.labels(reason="deadline").inc()
            self._admission.completed()
            raise
        except asyncio.CancelledError:
            client.cancel(request_id)  # counted by the request's admission reservation
            raise
        except ServiceError as error:
            self._metrics.generation_failures.labels(code=error.code).inc()
            self._admission.completed()
            raise
        total = time.monotonic() - sent
        queue_s = max(0.0, total - answer.inference_s)
        self._admission.completed(answer.result.completion_tokens)
        self._metrics.queue_wait.observe(queue_s)
        self._metrics.inference_duration.observe(answer.inference_s)
        self._metrics.prompt_tokens.inc(answer.result.prompt_tokens)
        self._metrics.cached_prompt_tokens.inc(answer.result.cached_tokens)
        self._metrics.generated_tokens.inc(answer.result.completion_tokens)
        if answer.result.finish_reason == "length":
            self._metrics.generations_cut.inc()
        return Scheduled(answer.result, queue_s, answer.inference_s)
