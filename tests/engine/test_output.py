"""The fast engine's output processor: streamed text decoded a few tokens at a time must be what
decoding the whole output gives, and the callers get each answer once."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from service.contract.errors import InvalidInput, ServiceError
from service.contract.types import Completion, GenerationResult
from service.engine.demo import ensure_demo_model
from service.engine.fast.output import Client, IncrementalText, OutputProcessor
from service.engine.fast.scheduler import Finished
from service.engine.fast.sequence import RowParameters, Sequence


@pytest.fixture(scope="module")
def tokenizer(data_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(ensure_demo_model(data_dir))


def _text_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_incremental_text_is_the_whole_decode(
    tokenizer: PreTrainedTokenizerBase, data: st.DataObject
) -> None:
    """After every token the text is a prefix of the whole output's decode, and once no
    character is left incomplete it is all of it."""
    ids = _text_ids(tokenizer)
    # Texts the model would write: tokens of real text, and any token ids at all.
    sample = data.draw(st.text(max_size=40))
    tokens = list(tokenizer.encode(sample, add_special_tokens=False))
    tokens += data.draw(st.lists(st.sampled_from(ids), max_size=12))
    incremental = IncrementalText(tokenizer)
    for count, token in enumerate(tokens, start=1):
        incremental.add(token)
        whole = str(tokenizer.decode(tokens[:count], skip_special_tokens=True))
        assert whole.startswith(incremental.text)
        if not whole.endswith("\ufffd"):
            assert incremental.text == whole


def _sequence(name: str) -> Sequence:
    return Sequence(name, (1, 2, 3), 8, RowParameters(True, 1.0, 1, 1.0, 1.0), True, 0.0)


async def test_streamed_text_grows_and_every_caller_is_answered_once(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    loop = asyncio.get_running_loop()
    answers: dict[str, list[GenerationResult | ServiceError]] = {}
    texts: list[str] = []
    output = OutputProcessor(tokenizer, frozenset(tokenizer.all_special_ids))

    def answered(name: str) -> Completion:
        def done(result: GenerationResult | ServiceError, _queued: float, _ran: float) -> None:
            answers.setdefault(name, []).append(result)

        return done

    for name in ("a", "b"):
        on_text = texts.append if name == "a" else None
        output.register(name, Client(loop=loop, on_done=answered(name), on_text=on_text))
    tokens = list(tokenizer.encode("hello there, how are you", add_special_tokens=False))
    output.stream(("a", token) for token in tokens)
    output.finish([Finished(_sequence("a"), tokens)])
    output.answer(_sequence("b"), InvalidInput("no"))
    output.answer(_sequence("b"), InvalidInput("again"))  # already answered: nothing
    await asyncio.sleep(0)
    whole = str(tokenizer.decode(tokens, skip_special_tokens=True)).strip()
    assert texts
    assert all(whole.startswith(text) for text in texts)
    assert all(len(a) < len(b) for a, b in itertools.pairwise(texts))
    assert len(answers["a"]) == 1
    result = answers["a"][0]
    assert isinstance(result, GenerationResult)
    assert result.text == whole
    assert [type(error) for error in answers["b"]] == [InvalidInput]
