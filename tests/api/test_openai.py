"""The OpenAI-compatible API driven by the official ``openai`` client: models, chat
completions, streaming in OpenAI's chunk format, and OpenAI-shaped errors."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from service.frontend.api.openai import StopCut
from tests.conftest import KEYS, ServiceClient
from tests.fakes import FAKE_CACHED_BLOCK

PROMPT = "Translate the following segment into German, without additional explanation.\n\nHi"


def client_of(keyed: ServiceClient, key: str = KEYS[0]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=key,
        base_url="http://service/v1",
        http_client=keyed.http,  # type: ignore[arg-type]  # in-process, through ASGI
        max_retries=0,
    )


async def model_of(client: openai.AsyncOpenAI) -> str:
    models = await client.models.list()
    (model,) = models.data
    return model.id


async def test_models_and_a_chat_completion(keyed: ServiceClient) -> None:
    client = client_of(keyed)
    model = await model_of(client)
    assert (await client.models.retrieve(model)).id == model
    answer = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=16
    )
    (choice,) = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content is not None
    assert choice.message.content.startswith("out:")  # the fake engine's answer
    assert choice.finish_reason == "stop"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 3
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 3
    # The prompt tokens the engine took from a kept prefix, in OpenAI's field for them.
    details = answer.usage.prompt_tokens_details
    assert details is not None
    cached = FAKE_CACHED_BLOCK * ((answer.usage.prompt_tokens - 1) // FAKE_CACHED_BLOCK)
    assert details.cached_tokens == cached > 0


async def test_streaming_gives_the_same_answer_in_chunks(keyed: ServiceClient) -> None:
    client = client_of(keyed)
    model = await model_of(client)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT + " there"}]
    whole = await client.chat.completions.create(model=model, messages=messages, temperature=0)
    stream = await client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    finishes: list[str] = []
    usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    assert "".join(pieces) == whole.choices[0].message.content
    assert finishes == ["stop"]
    assert usage is not None
    assert usage.completion_tokens == 3


async def test_stop_strings_cut_the_answer(keyed: ServiceClient) -> None:
    client = client_of(keyed)
    answer = await client.chat.completions.create(
        model=await model_of(client),
        messages=[{"role": "user", "content": PROMPT + "!"}],
        stop=[":"],
    )
    assert answer.choices[0].message.content == "out"
    assert answer.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
        (
            {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]},
            "one user message",
        ),
    ],
)
async def test_what_the_model_cannot_do_is_a_400_naming_it(
    keyed: ServiceClient, options: dict[str, object], words: str
) -> None:
    client = client_of(keyed)
    request: dict[str, object] = {
        "model": await model_of(client),
        "messages": [{"role": "user", "content": PROMPT}],
        **options,
    }
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(**request)  # type: ignore[call-overload]
    assert words in refused.value.message
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["type"] == "invalid_request_error"


async def test_unknown_model_and_keys_are_openai_errors(keyed: ServiceClient) -> None:
    client = client_of(keyed)
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": PROMPT}]
        )
    missing = await keyed.http.get("/v1/models")  # the client insists on sending a key
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.PermissionDeniedError):
        await client_of(keyed, key="wrong").models.list()


def test_a_stop_string_split_over_streamed_pieces_is_cut() -> None:
    cut = StopCut(["END", "##"])
    sent = [cut.feed(piece) for piece in ("Hallo E", "N", "D Welt")]
    assert sent == ["Hallo ", "", ""]
    assert cut.stopped
    assert cut.rest() == ""
    # A held-back start that turns out not to be a stop string is sent with what follows.
    other = StopCut(["END"])
    assert [other.feed("ab E"), other.feed("x"), other.rest()] == ["ab ", "Ex", ""]
    tail = StopCut(["END"])
    assert [tail.feed("ab EN"), tail.rest()] == ["ab ", "EN"]
