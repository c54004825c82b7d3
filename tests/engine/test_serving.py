"""The serving engine on the demo model through HTTP, on CPU: budgets, per-request decoding,
streaming; and bitsandbytes weights on transformers' continuous batching."""

from __future__ import annotations

import asyncio
import json

from tests.conftest import ServiceClient, StartApp


async def test_bitsandbytes_weights_are_served_by_the_fast_engine(
    start_app: StartApp,
) -> None:
    client: ServiceClient = await start_app(quantization="int8", max_new_tokens=12)
    health = await client.http.get("/health")
    assert health.status_code == 200, health.text
    assert (health.json()["engine"], health.json()["quantization"]) == ("fast", "int8")
    texts = ["short", "a somewhat longer sentence to translate", "今天天气很好", "x y z"]
    single, batch = await asyncio.gather(
        client.http.post("/translate", json={"text": "hello there", "target_lang": "de"}),
        client.http.post("/batch_translate", json={"texts": texts, "target_lang": "fr"}),
    )
    assert single.status_code == 200, single.text
    assert 0 < single.json()["usage"]["output_tokens"] <= 12
    assert batch.status_code == 200, batch.text
    items = batch.json()["translations"]
    assert len(items) == len(texts)
    assert items[2]["source_lang"] == "zh"
    metrics = (await client.http.get("/metrics")).text
    assert "hymt_generated_tokens_total" in metrics
    assert "hymt_queue_wait_seconds_count 7.0" in metrics  # 2 warm-up texts + 5 texts


async def test_each_text_gets_its_own_budget(start_app: StartApp) -> None:
    client: ServiceClient = await start_app(
        max_new_tokens=64, output_tokens_ratio=1.0, output_tokens_margin=2
    )
    short, long = await asyncio.gather(
        client.http.post("/translate", json={"text": "hi", "target_lang": "de"}),
        client.http.post(
            "/translate", json={"text": "one two three four five six seven", "target_lang": "de"}
        ),
    )
    # Random weights rarely emit EOS, so each runs to its own budget (ratio x source + margin).
    # "hi" is at most 2 tokens (budget <= 4); the long text is at least 7 (budget >= 9).
    assert short.json()["usage"]["output_tokens"] <= 4
    assert long.json()["usage"]["output_tokens"] >= 9


async def test_decoding_is_per_request(start_app: StartApp) -> None:
    # One running batch, each request with its own sampling: greedy ones give the same text
    # beside sampled ones as alone; sampled ones vary.
    texts = ["short", "a somewhat longer sentence to translate", "今天天气很好"]
    client: ServiceClient = await start_app(max_new_tokens=10, cache_size=0)
    expected = await client.http.post(
        "/batch_translate", json={"texts": texts, "target_lang": "fr"}
    )

    def chat(temperature: float) -> dict[str, object]:
        return {
            "model": "hunyuan-mt-demo-v1",
            "messages": [{"role": "user", "content": "Translate into French:\n\nhello"}],
            "temperature": temperature,
            "top_k": 0,
            "top_p": 1.0,
            "max_tokens": 10,
        }

    # Identical requests in flight share one generation, so the samples are drawn one by one.
    greedy, first = await asyncio.gather(
        client.http.post("/batch_translate", json={"texts": texts, "target_lang": "fr"}),
        client.http.post("/v1/chat/completions", json=chat(1.5)),
    )
    assert greedy.status_code == 200, greedy.text
    assert greedy.json()["translations"] == expected.json()["translations"]
    answers = [first.json()["choices"][0]["message"]["content"]]
    for _ in range(2):
        response = await client.http.post("/v1/chat/completions", json=chat(1.5))
        assert response.status_code == 200, response.text
        answers.append(response.json()["choices"][0]["message"]["content"])
    assert len(set(answers)) > 1
    argmax = [await client.http.post("/v1/chat/completions", json=chat(0)) for _ in range(2)]
    assert len({r.json()["choices"][0]["message"]["content"] for r in argmax}) == 1


async def test_chat_completions_stream_step_by_step(start_app: StartApp) -> None:
    client: ServiceClient = await start_app(max_new_tokens=12, cache_size=0)
    chat = {
        "model": "hunyuan-mt-demo-v1",
        "messages": [{"role": "user", "content": "Translate into German:\n\ngood morning"}],
        "temperature": 0,
    }
    whole = await client.http.post("/v1/chat/completions", json=chat)
    assert whole.status_code == 200, whole.text
    streamed = await client.http.post(
        "/v1/chat/completions",
        json={**chat, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [
        line.removeprefix("data: ")
        for line in streamed.text.splitlines()
        if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]]
    # The role chunk, then the text as the engine generated it: several pieces, not one.
    assert len([piece for piece in pieces if piece]) > 1
    assert "".join(pieces) == whole.json()["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == whole.json()["usage"]


async def test_translate_stream_sends_pieces_then_the_answer(start_app: StartApp) -> None:
    client: ServiceClient = await start_app(max_new_tokens=12, cache_size=0)
    body = {"text": "good morning to all of you", "target_lang": "de", "source_lang": "en"}
    whole = await client.http.post("/translate", json=body)
    streamed = await client.http.post("/translate/stream", json=body)
    assert streamed.status_code == 200, streamed.text
    events = [block.splitlines() for block in streamed.text.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in events]
    data = [json.loads(lines[1].removeprefix("data: ")) for lines in events]
    assert names[-1] == "done"
    assert names.count("piece") > 1  # the text as the engine generated it
    assert "".join(d["text"] for d in data[:-1]) == data[-1]["translation"]
    assert data[-1]["translation"] == whole.json()["translation"]
    assert data[-1]["usage"] == whole.json()["usage"]
    refused = await client.http.post("/translate/stream", json={**body, "target_lang": "xx"})
    assert refused.status_code == 422  # before the stream starts: a JSON error
    assert refused.json()["error"]["code"] == "unknown_language"


async def test_the_template_shared_by_prompts_is_computed_once_and_counted(
    start_app: StartApp,
) -> None:
    # Every German prompt starts with the same template: from the third one on, the engine
    # copies its blocks instead of computing them, and says so in /metrics.
    client: ServiceClient = await start_app(max_new_tokens=4)
    for text in ("the first text", "a second text", "and a third one", "a fourth"):
        answer = await client.http.post("/translate", json={"text": text, "target_lang": "de"})
        assert answer.status_code == 200, answer.text
    metrics = (await client.http.get("/metrics")).text
    (line,) = [
        ln for ln in metrics.splitlines() if ln.startswith("hymt_prompt_tokens_cached_total")
    ]
    assert float(line.split()[-1]) >= 8
