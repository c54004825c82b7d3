"""Two API processes' apps, one engine: the follower serves through the leader's engine."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.api.test_faults import engine_pid, until
from tests.conftest import MakeSettings, started
from tests.fakes import FakeControl

BODY = {"text": "hello", "target_lang": "de"}


async def test_a_follower_started_again_translates_through_the_leaders_engine(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    fake = FakeControl(tmp_path / "fake")
    peer = (f"ipc://{tmp_path}/follower-requests", f"ipc://{tmp_path}/follower-results")
    settings = make_settings(warmup=False)
    async with started(settings, fake.loader(), followers=[peer]) as leader:
        async with started(settings, follow=peer) as first:
            await until(lambda: first.runtime.failure() is None)
        # A follower started again on the same sockets, after the engine's Ready was taken by
        # its predecessor (as the launcher restarts one that died): it asks for it again.
        async with started(settings, follow=peer) as follower:
            await until(lambda: follower.runtime.failure() is None)
            for client in (leader, follower):
                health = await client.http.get("/health")
                assert health.status_code == 200, health.text
                answer = await client.http.post("/translate", json=BODY)
                assert answer.status_code == 200, answer.text
            assert follower.runtime.supervisor.working_client() is not None


async def test_a_follower_follows_the_leaders_engine_through_its_restart(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    fake = FakeControl(tmp_path / "fake")
    peer = (f"ipc://{tmp_path}/follower-requests", f"ipc://{tmp_path}/follower-results")
    settings = make_settings(warmup=False, engine_heartbeat_timeout_s=1.0)
    async with (
        started(settings, fake.loader(), followers=[peer]) as leader,
        started(settings, follow=peer) as follower,
    ):
        await until(lambda: follower.runtime.failure() is None)
        os.kill(engine_pid(leader), signal.SIGKILL)
        # Silence for a heartbeat timeout: the follower refuses instead of waiting on a dead
        # engine, then takes the leader's restarted engine.
        await until(lambda: follower.runtime.failure() is not None, timeout_s=5)
        refused = await follower.http.post("/translate", json=BODY)
        assert refused.status_code == 503
        await until(lambda: follower.runtime.failure() is None, timeout_s=20)
        answer = await follower.http.post("/translate", json=BODY)
        assert answer.status_code == 200, answer.text


async def test_two_api_processes_count_one_rate_limit_together(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    """A client whose requests the kernel spreads over the processes gets its limit once, not
    once per process (the group's counters are one file)."""
    fake = FakeControl(tmp_path / "fake")
    peer = (f"ipc://{tmp_path}/follower-requests", f"ipc://{tmp_path}/follower-results")
    settings = make_settings(warmup=False, rate_limit="4/hour", api_keys=["k"])
    shared = tmp_path / "limits.sqlite3"
    headers = {"authorization": "Bearer k"}
    async with (
        started(settings, fake.loader(), followers=[peer], limits_file=shared) as leader,
        started(settings, follow=peer, limits_file=shared) as follower,
    ):
        await until(lambda: follower.runtime.failure() is None)
        statuses = [
            (await client.http.post("/translate", json=BODY, headers=headers)).status_code
            for client in (leader, follower) * 4
        ]
    assert statuses == [200, 200, 200, 200, 429, 429, 429, 429]
