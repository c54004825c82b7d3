"""The engine of bitsandbytes weights (nf4, int8) until the fast engine reads them: transformers'
own ``ContinuousBatchingManager``, sized by the fast engine's settings.

Requests join and leave the running batch at every decode step (paged KV cache, no padding to the
longest member), so a short translation never waits for a long one. The manager runs its own
generation thread; results come back to the event loop through ``register_result_handler``
(``call_soon_threadsafe``), where the new tokens are decoded.

On CUDA the attention is torch's FlashAttention-2 varlen kernel (``attention.py``): transformers'
default masked SDPA attends every request to every other's keys.

Decoding is per request (``sampling.py``): each request carries its own temperature, top-k and
top-p, and a greedy one samples with top-k 1, which picks the token argmax picks. Limit of
transformers' implementation, as of 5.24: ``repetition_penalty`` is not applied (its logits
processor has no continuous-batching version and is dropped).
"""

from __future__ import annotations

import dataclasses
import logging

from transformers import ContinuousBatchingConfig
from transformers.generation.continuous_batching.requests import GenerationOutput

from service.config.engine import EngineConfig
from service.contract.errors import EngineUnavailable, GenerationFailed, OutOfMemory, ServiceError
from service.contract.types import (
    MODEL_CARD_DECODING,
    Completion,
    GenerationRequest,
    GenerationResult,
    TextSink,
)
from service.engine.attention import use_varlen_attention, wants_varlen
from service.engine.generation import LoadedEngine, generation_config
from service.engine.loading import LoadedModel
from service.engine.sampling import PerRequestSampling, request_kwargs

log = logging.getLogger(__name__)

# transformers' KV-cache block, in tokens.
_BLOCK_SIZE = 256


class ContinuousBatchingEngine(LoadedEngine):
    """Implements ``Engine`` with transformers' continuous batching manager."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        fast = config.fast
        if wants_varlen("auto", loaded.device, loaded.dtype):
            use_varlen_attention(loaded.model)
        super().__init__(loaded)
        generation = generation_config(
            # Sampling (the manager draws from the processed logits); the processors are
            # replaced by ``PerRequestSampling`` below. Repetition penalty: dropped by the
            # manager anyway (no continuous-batching version of the processor).
            dataclasses.replace(MODEL_CARD_DECODING, repetition_penalty=1.0),
            config.max_new_tokens,
            self._pad_id,
            tuple(sorted(self._eos_ids)),
        )
        # The fast engine's budget, in transformers' terms: its cache in blocks of the
        # manager's size, its rows, its prefill chunk and its share of the free memory.
        cuda_graph = {"auto": None, "on": True, "off": False}[fast.cuda_graph]
        blocks = (
            None
            if fast.num_pages is None
            else max(1, -(-fast.num_pages * fast.page_size // _BLOCK_SIZE))
        )
        batching_config = ContinuousBatchingConfig(
            num_blocks=blocks,
            page_size=_BLOCK_SIZE,
            max_batch_tokens=fast.prefill_tokens,
            max_requests_per_batch=fast.max_rows,
            use_cuda_graph=cuda_graph,
            max_memory_percent=fast.memory_fraction,
        )
        self._manager = loaded.model.init_continuous_batching(  # type: ignore[operator]
            generation_config=generation, continuous_batching_config=batching_config
        )
        # Before the batch processor that reads it exists (warm-up creates it).
        self._manager.logit_processor = PerRequestSampling(config.decoding)
        # CUDA graph capture and compilation happen here, before the service reports ready.
        self._manager.warmup()
        self._manager.start()

    def submit(
        self,
        request_id: str,
        request: GenerationRequest,
        on_done: Completion,
        on_text: TextSink | None = None,
    ) -> None:
        """Add ``request`` to the running batch; ``on_done`` (and ``on_text`` with the text so
        far, after each step while it grows) is called on this event loop."""
        if not self._manager.is_running():
            raise EngineUnavailable("the generation thread is not running")
        prompt_tokens = len(request.prompt_ids)

        def handle(output: GenerationOutput) -> None:
            if output.is_finished():
                on_done(self._result(output, prompt_tokens), *self._timings(output))
            elif on_text is not None and output.error is None:
                on_text(self._detokenizer.prefix(output.generated_tokens))

        self._manager.register_result_handler(request_id, handle)
        accepted = self._manager.add_request(
            list(request.prompt_ids),
            request_id=request_id,
            max_new_tokens=request.max_new_tokens,
            streaming=on_text is not None,
            **request_kwargs(request.decoding),
        )
        if accepted is None:
            raise EngineUnavailable("the generation thread refused the request")

    def cancel(self, request_id: str) -> None:
        self._manager.cancel_request(request_id)

    def capacity(self) -> int | None:
        processor = self._manager.batch_processor
        if processor is None:
            return None
        return int(processor.scheduler.max_requests_per_batch)

    def running(self) -> int | None:
        """Requests generating now (scheduled into the batch), None before the first step."""
        processor = self._manager.batch_processor
        if processor is None:
            return None
        return len(processor.scheduler.active_requests)

    def steps(self) -> int | None:
        return None  # transformers' manager does not count them

    def step_seconds(self) -> dict[int, float]:
        return {}  # not measured: admission waits for answers

    def is_alive(self) -> bool:
        return bool(self._manager.is_running())

    def close(self) -> None:
        self._manager.stop(block=True, timeout=30)

    def _result(
        self, output: GenerationOutput, prompt_tokens: int
    ) -> GenerationResult | ServiceError:
        if output.error is not None:
            log.error("generation failed", extra={"error": output.error})
            if "out of memory" in output.error.lower():
                return OutOfMemory("out of memory while generating")
            return GenerationFailed("the model failed to generate")
        (result,) = self._detokenizer.results([prompt_tokens], [output.generated_tokens])
        return result

    @staticmethod
    def _timings(output: GenerationOutput) -> tuple[float, float]:
        started, finished = output.lifespan
        if started < 0 or finished < 0:
            return 0.0, 0.0
        return max(0.0, started - output.created_time), max(0.0, finished - started)
