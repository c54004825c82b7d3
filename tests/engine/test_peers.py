"""One engine process serving several API processes: each gets its own answers, all get reports."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from loadtests.ipc import DECODING
from service.config.engine import EngineConfig
from service.contract.errors import EngineUnavailable
from service.contract.protocol import Finished, Ready, Stats, Submit, api_decoder, encoder
from service.contract.types import GenerationRequest
from service.frontend.engine_link.client import EngineClient
from service.frontend.engine_link.follower import EngineFollower
from service.wiring import engine_entry
from tests.api.test_faults import until
from tests.fakes import FakeControl


async def test_a_second_api_process_gets_its_own_answers_and_every_report(
    tmp_path: Path,
) -> None:
    fake = FakeControl(tmp_path / "fake")
    context = zmq.asyncio.Context()
    requests, results = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    follower = (f"ipc://{tmp_path}/f-requests", f"ipc://{tmp_path}/f-results")
    results.bind(follower[1])
    requests.connect(follower[0])
    config = EngineConfig()
    leader = EngineClient(config, engine_entry(fake.loader()), followers=[follower])
    decoder = api_decoder()
    try:
        await leader.start()

        async def next_of(kind: type) -> object:
            while True:
                message = decoder.decode(await asyncio.wait_for(results.recv(), 10))
                if isinstance(message, kind):
                    return message

        assert isinstance(await next_of(Ready), Ready)
        assert isinstance(await next_of(Stats), Stats)
        # The same id as a request of the leader's: ids are each API process's own.
        request = GenerationRequest(tuple(range(5)), 4, DECODING)
        _, leaders = leader.submit(request, None)
        submit = Submit(id=1, prompt_ids=[1, 2, 3], max_new_tokens=4, decoding=DECODING)
        requests.send(encoder().encode(submit))
        finished = await next_of(Finished)
        assert isinstance(finished, Finished)
        assert finished.id == 1
        assert finished.result.prompt_tokens == 3
        assert (await asyncio.wait_for(leaders, 10)).result.prompt_tokens == 5
    finally:
        await leader.stop()
        requests.close(linger=0)
        results.close(linger=0)
        context.term()


async def test_a_follower_serves_through_the_leaders_engine_and_follows_its_restart(
    tmp_path: Path,
) -> None:
    fake = FakeControl(tmp_path / "fake")
    peer = (f"ipc://{tmp_path}/f-requests", f"ipc://{tmp_path}/f-results")
    adopted: list[int] = []

    async def on_ready(ready: Ready) -> None:
        adopted.append(ready.incarnation)

    follower = EngineFollower(peer, heartbeat_timeout_s=0.5, on_ready=on_ready)
    follower.start()
    config = EngineConfig()
    request = GenerationRequest(tuple(range(7)), 4, DECODING)
    first = EngineClient(config, engine_entry(fake.loader()), followers=[peer])
    try:
        await first.start()
        await until(lambda: follower.available)
        _, answer = follower.submit(request, None)
        assert (await asyncio.wait_for(answer, 10)).result.prompt_tokens == 7
        fake.hold()
        _, held = follower.submit(request, None)
        await first.stop()  # the engine is gone; the follower hears nothing more
        await until(lambda: not follower.available, timeout_s=5)
        follower.check()
        with pytest.raises(EngineUnavailable):
            await asyncio.wait_for(held, 5)
        fake.release()
        second = EngineClient(config, engine_entry(fake.loader()), followers=[peer])
        await second.start()
        try:
            await until(lambda: follower.available)
            _, again = follower.submit(request, None)
            assert (await asyncio.wait_for(again, 10)).result.prompt_tokens == 7
            assert len(adopted) == 2
            assert adopted[0] != adopted[1]
        finally:
            await second.stop()
    finally:
        await first.stop()
        await follower.stop()
