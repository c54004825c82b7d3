"""OpenAI-compatible endpoints, mounted under ``/v1``: ``GET /v1/models``, ``POST
/v1/chat/completions`` (and ``stream: true`` as server-sent events in OpenAI's chunk format).

For the platforms that call Hunyuan-MT through vLLM or TGI: the user message is the prompt as
Tencent documents it ("Translate the following segment into Chinese, without additional
explanation.\\n\\n..."), rendered with the model's chat template and sent through the same
admission, cache, scheduler and quotas as a translation. One user message (what the model was
trained on); ``max_tokens``/``max_completion_tokens`` up to ``HYMT_MAX_NEW_TOKENS``,
``temperature`` 0-2 (0: greedy), ``top_p`` (0-1], vLLM's ``top_k`` and ``repetition_penalty``;
``stop`` (up to 4 strings) cuts the answer at the first one; ``n`` must be 1. Anything the model
cannot do (tools, logprobs, JSON mode, penalties) is refused with an OpenAI-shaped 400 naming it.

Streaming sends the role, the text in chunks as the engine generates it (step by step), the
finish, the usage when asked, then ``[DONE]``. A stream is
never cached or shared.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from service.contract.errors import (
    DeadlineExceeded,
    Forbidden,
    InvalidInput,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    QuotaExceeded,
    ServiceError,
    Unauthenticated,
    Unsupported,
    UnsupportedEncoding,
)
from service.contract.types import Decoding
from service.frontend.access import AccessControl
from service.frontend.api.context import RequestContext
from service.frontend.api.errors import Dialect
from service.frontend.api.mounts import dialect_app
from service.frontend.api.params import Params, parse, read_params
from service.frontend.runtime import Runtime
from service.frontend.translation.results import Completion

_STATUS = {
    InvalidInput: 400,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    DeadlineExceeded: 504,
}
# OpenAI's error types by the domain's error.
_TYPES: tuple[tuple[type[ServiceError], str], ...] = (
    (InvalidInput, "invalid_request_error"),
    (NotFound, "invalid_request_error"),
    (MethodNotAllowed, "invalid_request_error"),
    (PayloadTooLarge, "invalid_request_error"),
    (UnsupportedEncoding, "invalid_request_error"),
    (Unauthenticated, "authentication_error"),
    (Forbidden, "permission_error"),
    (QuotaExceeded, "insufficient_quota"),
    (Overloaded, "rate_limit_error"),
)


def _body(error: ServiceError) -> dict[str, object]:
    kind = next((name for cls, name in _TYPES if isinstance(error, cls)), "server_error")
    return {"error": {"message": error.message, "type": kind, "param": None, "code": error.code}}


OPENAI = Dialect("/v1", _STATUS, _body)
# Parameters whose effect the model cannot produce: refused when set to anything but "off".
_REFUSED = ("tools", "tool_choice", "functions", "function_call", "logprobs", "top_logprobs")
_MAX_STOPS = 4


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        parts = self.content or []
        if any(part.get("type") != "text" for part in parts):
            raise Unsupported("messages: only text content is supported")
        return "".join(str(part.get("text", "")) for part in parts)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None


def create_openai_app(runtime: Runtime, access: AccessControl) -> FastAPI:
    app = dialect_app("OpenAI-compatible API", runtime, access, OPENAI)
    created = int(time.time())

    def model_id() -> str:
        info = runtime.engine_info
        return info.model if info is not None else "hunyuan-mt"

    def model_entry() -> dict[str, object]:
        return {"id": model_id(), "object": "model", "created": created, "owned_by": "hunyuan-mt"}

    @app.get("/models")
    async def models(request: Request) -> JSONResponse:
        await RequestContext.build(request, request.headers.get("authorization"))
        return JSONResponse({"object": "list", "data": [model_entry()]})

    @app.get("/models/{name:path}")
    async def model(request: Request, name: str) -> JSONResponse:
        await RequestContext.build(request, request.headers.get("authorization"))
        if name != model_id():
            raise NotFound(f"The model `{name}` does not exist.")
        return JSONResponse(model_entry())

    @app.post("/chat/completions", response_model=None)
    async def chat(request: Request) -> JSONResponse | StreamingResponse:
        # The key first, as OpenAI does: a caller without one learns nothing about bodies.
        context = await RequestContext.build(request, request.headers.get("authorization"))
        params = await read_params(request)
        body = parse(ChatRequest, params)
        _refuse_unsupported(body, params)
        if body.model != model_id():
            raise NotFound(f"The model `{body.model}` does not exist.")
        translator = context.translator
        content = _prompt(body)
        decoding = _decoding(body, translator.decoding)
        limit = translator.max_new_tokens
        budget = body.max_completion_tokens or body.max_tokens or limit
        if budget > limit:
            raise InvalidInput(f"max_tokens: {budget}, at most {limit} for this server")
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stops) > _MAX_STOPS or not all(stops):
            raise InvalidInput(f"stop: at most {_MAX_STOPS} non-empty strings")
        await context.charge(len(content))
        ident = f"chatcmpl-{request.scope.get('state', {}).get('request_id', '')}"
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            pieces = translator.stream(
                content, decoding=decoding, max_new_tokens=budget, deadline=context.deadline
            )
            # Admission, preparation and the first piece before the answer starts: a refusal
            # or a bad input is an ordinary JSON error, not a stream.
            first = await anext(pieces)
            events = _events(ident, body.model, first, pieces, stops, include_usage)
            # Nginx buffers proxied answers unless told not to: each event must leave at once.
            return StreamingResponse(
                events,
                media_type="text/event-stream",
                headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"},
            )
        completion = await translator.complete(
            content, decoding=decoding, max_new_tokens=budget, deadline=context.deadline
        )
        return JSONResponse(_completion(ident, body.model, completion, stops))

    return app


def _completion(
    ident: str, model: str, completion: Completion, stops: list[str]
) -> dict[str, object]:
    """A whole chat completion, cut at the first stop sequence."""
    text, finish = _cut(completion, stops)
    return {
        "id": ident,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
        ],
        "usage": _usage(completion),
    }


def _refuse_unsupported(body: ChatRequest, params: Params) -> None:
    """Refuse, naming them, the parameters asking for what the model cannot do."""
    refused = [name for name in _REFUSED if params.get(name) not in (None, False, [], "none")]
    if body.n != 1:
        refused.append("n")
    refused += [
        name
        for name in ("presence_penalty", "frequency_penalty")
        if getattr(body, name) not in (None, 0)
    ]
    if body.response_format is not None and body.response_format.get("type") != "text":
        refused.append("response_format")
    if refused:
        raise Unsupported(f"unsupported parameter(s) for this model: {', '.join(refused)}")


def _prompt(body: ChatRequest) -> str:
    """The one user turn the model answers."""
    roles = [message.role for message in body.messages]
    if roles != ["user"]:
        raise Unsupported(
            "messages: this translation model takes one user message (the prompt, e.g. "
            "'Translate the following segment into Chinese, without additional explanation."
            f"\\n\\n<text>'); got roles {roles}"
        )
    return body.messages[0].text()


def _decoding(body: ChatRequest, default: Decoding) -> Decoding:
    temperature = default.temperature if body.temperature is None else body.temperature
    return Decoding(
        greedy=temperature == 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=default.top_k if body.top_k in (None, -1) else body.top_k,
        top_p=default.top_p if body.top_p is None else body.top_p,
        repetition_penalty=(
            default.repetition_penalty
            if body.repetition_penalty is None
            else body.repetition_penalty
        ),
    )


def _cut(completion: Completion, stops: list[str]) -> tuple[str, Literal["stop", "length"]]:
    """The answer up to the first stop string (excluded), and why it ended."""
    text = completion.text
    cuts = [text.index(stop) for stop in stops if stop in text]
    if cuts:
        return text[: min(cuts)], "stop"
    return text, "length" if completion.finish_reason == "length" else "stop"


def _usage(completion: Completion) -> dict[str, object]:
    return {
        "prompt_tokens": completion.input_tokens,
        "completion_tokens": completion.output_tokens,
        "total_tokens": completion.input_tokens + completion.output_tokens,
        # Prompt tokens the engine took from a kept prefix instead of computing them.
        "prompt_tokens_details": {"cached_tokens": completion.cached_tokens},
    }


class StopCut:
    """Cuts streamed text at the first stop string: text that could still be the start of one
    is held back until the next piece says whether it is."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = stops
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The part of ``piece`` (with what was held back) that can be sent now."""
        if self.stopped:
            return ""
        text = self._held + piece
        cuts = [text.index(stop) for stop in self._stops if stop in text]
        if cuts:
            self.stopped, self._held = True, ""
            return text[: min(cuts)]
        keep = max(
            (n for stop in self._stops for n in range(1, len(stop)) if text.endswith(stop[:n])),
            default=0,
        )
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def rest(self) -> str:
        """What was held back, once the text has ended without a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


async def _events(
    ident: str,
    model: str,
    first: str | Completion,
    pieces: AsyncIterator[str | Completion],
    stops: list[str],
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """Server-sent events in OpenAI's chunk format: the role, a chunk per piece of text as the
    engine streams it, the finish reason, the usage when asked, ``[DONE]``. After a stop
    string the generation still runs to its end (its tokens are counted in the usage) but no
    more text is sent. An error after the stream began comes as an event with OpenAI's error
    object."""
    created = int(time.time())

    def event(chunk: dict[str, Any]) -> bytes:
        body = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model}
        return f"data: {json.dumps({**body, **chunk}, ensure_ascii=False)}\n\n".encode()

    def delta(content: dict[str, str], reason: str | None = None) -> bytes:
        return event({"choices": [{"index": 0, "delta": content, "finish_reason": reason}]})

    cut = StopCut(stops)
    yield delta({"role": "assistant", "content": ""})
    item: str | Completion | None = first
    try:
        while isinstance(item, str):
            if text := cut.feed(item):
                yield delta({"content": text})
            item = await anext(pieces, None)
    except ServiceError as error:
        yield f"data: {json.dumps(_body(error))}\n\n".encode()
        yield b"data: [DONE]\n\n"
        return
    if text := cut.rest():
        yield delta({"content": text})
    assert isinstance(item, Completion)
    finish = "stop" if cut.stopped or item.finish_reason != "length" else "length"
    yield delta({}, finish)
    if include_usage:
        yield event({"choices": [], "usage": _usage(item)})
    yield b"data: [DONE]\n\n"
