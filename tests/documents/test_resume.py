"""An accepted document is never lost: a job whose process stopped (crashed, killed, or the
service restarted) is resumed from its stored file and options by the next process to look, and
only there; one that keeps bringing its process down fails after a few runs."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import httpx
from hypothesis import given
from hypothesis import strategies as st

from service.contract.errors import NotReady
from service.frontend.documents.formats import Unit
from service.frontend.documents.jobs import JobStore
from service.frontend.documents.records import HEARTBEAT_LOST_S, MAX_ATTEMPTS, Job
from service.frontend.documents.resume import Resumer, decode_request, encode_request
from service.frontend.documents.runner import DocumentRunner
from service.frontend.translation.prompts import PLAIN, TranslationOptions
from service.frontend.translation.translator import Translator
from tests.conftest import MakeSettings, ServiceClient, StartApp, own_data, started
from tests.fakes import FakeControl

AUTH = {"Authorization": "DeepL-Auth-Key k"}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def pass_heartbeat_timeout(self) -> None:
        self.now += HEARTBEAT_LOST_S + 1


def _job(store: JobStore, claim: str = "A") -> Job:
    return store.create(
        "owner",
        "a.txt",
        "txt",
        b"Hello there.",
        "de",
        None,
        "{}",
        12,
        encode_request(PLAIN),
        claim,
        "owner",
    )


def test_a_job_whose_process_stopped_is_resumed_elsewhere_and_finished_only_there(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = JobStore(tmp_path, clock=clock)
    job = _job(store)
    assert store.claims.claim_orphan("B") is None  # its heartbeat is fresh: A runs it
    clock.pass_heartbeat_timeout()
    # A stopped beating: the job reads as waiting to be resumed, not as failed.
    assert store.get("owner", job.id).state == "queued"
    taken = store.claims.claim_orphan("B")
    assert taken is not None
    assert (taken.id, taken.claim, taken.attempts, taken.state) == (job.id, "B", 2, "queued")
    assert store.claims.claim_orphan("C") is None  # claimed once
    # A, back (it was only stalled), learns the job runs elsewhere; its late result is not
    # the job's, nor is its failure.
    assert store.claims.beat([job.id], "A") == {job.id}
    store.fail(job, "A's failure")
    store.finish(job, b"A's result")
    assert store.get("owner", job.id).state == "queued"
    store.start(taken)
    assert store.claims.beat([job.id], "B") == set()
    store.finish(taken, b"B's result")
    assert store.result("owner", job.id)[1] == b"B's result"


def test_a_job_that_keeps_stopping_its_process_fails_after_the_last_attempt(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = JobStore(tmp_path, clock=clock)
    job = _job(store)
    for attempt in range(2, MAX_ATTEMPTS + 1):
        clock.pass_heartbeat_timeout()
        taken = store.claims.claim_orphan(f"process {attempt}")
        assert taken is not None
        assert taken.attempts == attempt
    clock.pass_heartbeat_timeout()
    assert store.claims.claim_orphan("one more") is None
    failed = store.get("owner", job.id)
    assert failed.state == "error"
    stops = f"the service stopped {MAX_ATTEMPTS} times"
    assert failed.error == f"{stops} while translating this document"


def test_a_job_handed_back_by_a_stopping_process_resumes_at_once_without_an_attempt(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = JobStore(tmp_path, clock=clock)
    job = _job(store)
    store.claims.release([job.id], "somebody else")  # not its claim: nothing happens
    assert store.claims.claim_orphan("B") is None
    store.claims.release([job.id], "A")
    taken = store.claims.claim_orphan("B")
    assert taken is not None
    assert taken.attempts == 1  # a stop that was asked for is not held against the document


def test_after_a_restart_unfinished_jobs_resume_and_jobs_of_before_resuming_fail(
    tmp_path: Path,
) -> None:
    # A jobs file of the layout before resuming: its unfinished job has no options to resume
    # with, so it fails, saying why; its done job stays done.
    old = sqlite3.connect(tmp_path / "jobs.sqlite3")
    old.executescript(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, key TEXT NOT NULL, owner TEXT NOT NULL, "
        "filename TEXT NOT NULL, format TEXT NOT NULL, target_lang TEXT NOT NULL, "
        "source_lang TEXT, options TEXT NOT NULL, state TEXT NOT NULL, error TEXT, "
        "characters INTEGER NOT NULL, done_characters INTEGER NOT NULL, created REAL NOT NULL, "
        "started REAL, heartbeat REAL, expires REAL NOT NULL);"
        "INSERT INTO jobs VALUES ('OLD', 'k', 'owner', 'a.txt', 'txt', 'de', NULL, '{}', "
        "'translating', NULL, 5, 0, 1, 1, 1, 9e15);"
        "INSERT INTO jobs VALUES ('DONE', 'k', 'owner', 'a.txt', 'txt', 'de', NULL, '{}', "
        "'done', NULL, 5, 5, 1, 1, 1, 9e15);"
    )
    old.close()
    store = JobStore(tmp_path)
    job = _job(store)  # a running job of the new layout, in a process that then stopped
    assert store.claims.requeue_unfinished() == 2
    assert store.claims.claim_orphan("B") is not None  # at once: nothing runs at a start
    assert store.claims.claim_orphan("C") is None
    assert store.claims.fail_hopeless() == 1
    old_job = store.get("owner", "OLD")
    assert old_job.state == "error"
    assert old_job.error == "the service restarted while translating this document"
    assert store.get("owner", "DONE").state == "done"
    assert store.get("owner", job.id).state == "queued"


async def test_jobs_are_resumed_only_while_the_service_serves(tmp_path: Path) -> None:
    # Claimed while the model loads, a job would wait for it and could fail on a long load; it
    # stays unclaimed until the service serves.
    clock = Clock()
    store = JobStore(tmp_path, clock=clock)
    job = _job(store, claim="a process that crashed")
    clock.pass_heartbeat_timeout()

    def loading() -> Translator:
        raise NotReady("the model is loading; retry shortly")

    class NeverRead:
        async def units(self, job: Job) -> list[Unit]:
            raise AssertionError("never read while loading")

        async def rebuilt(self, job: Job, translations: list[str]) -> bytes:
            raise AssertionError("never translated while loading")

    runner = DocumentRunner(store, loading, NeverRead())
    serving = False
    resumer = Resumer(store, runner, lambda: serving)
    assert await resumer.once() == 0
    assert store.get("owner", job.id).claim == "a process that crashed"
    serving = True
    assert await resumer.once() == 1
    assert store.get("owner", job.id).claim == runner.claim
    await runner.close()  # handed back, to be resumed by whoever looks next
    assert store.get("owner", job.id).claim is None


_TEXT = st.text(max_size=20)


@given(
    st.builds(
        TranslationOptions,
        glossary=st.lists(st.tuples(_TEXT, _TEXT), max_size=3).map(tuple),
        context=st.none() | _TEXT,
        format=st.sampled_from(["text", "markup", "json", "html", "csv", "markdown"]),
        style=st.none() | _TEXT,
        preferences=st.lists(_TEXT, max_size=3).map(tuple),
        delimiter=st.none() | _TEXT,
    )
)
def test_a_job_resumes_with_the_options_it_was_asked_with(options: TranslationOptions) -> None:
    assert decode_request(encode_request(options)) == options


async def _status(client: ServiceClient, job: dict[str, str]) -> str:
    response = await client.http.post(
        f"/v2/document/{job['document_id']}",
        json={"document_key": job["document_key"]},
        headers=AUTH,
    )
    assert response.status_code == 200, response.text
    state: str = response.json()["status"]
    return state


async def _until(client: ServiceClient, job: dict[str, str], states: set[str]) -> str:
    deadline = time.monotonic() + 30
    while (state := await _status(client, job)) not in states:
        assert time.monotonic() < deadline, state
        await asyncio.sleep(0.05)
    return state


async def test_a_document_translating_when_the_service_stops_is_finished_after_it_starts(
    make_settings: MakeSettings, fake: FakeControl, data_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(
        data_dir=own_data(data_dir, tmp_path / "data"), warmup=False, drain_timeout_s=0.5
    )
    document = ("file", ("a.txt", b"Hello there.\n\nA second paragraph.\n"))
    # Each engine step takes seconds: the job is mid-way when the service stops.
    async with started(settings, fake.loader(delay_s=3.0)) as client:
        upload = await client.http.post(
            "/v2/document", data={"target_lang": "DE"}, files=[document], headers=AUTH
        )
        assert upload.status_code == 200, upload.text
        job: dict[str, str] = upload.json()
        assert await _until(client, job, {"translating"}) == "translating"
    # Handed back as the service stopped: unfinished, run by none, its one run not counted (a
    # stop that was asked for).
    store = JobStore(settings.model.data_dir / "documents")
    stopped = store.get(None, job["document_id"], job["document_key"])
    store.close()
    assert (stopped.state, stopped.claim, stopped.attempts) == ("queued", None, 0)
    async with started(settings, fake.loader()) as client:
        assert await _until(client, job, {"done", "error"}) == "done"
        result = await client.http.post(
            f"/v2/document/{job['document_id']}/result",
            json={"document_key": job["document_key"]},
            headers=AUTH,
        )
        assert result.status_code == 200, result.text
        # The same as the same file uploaded to a service that never stopped.
        again = await client.http.post(
            "/v2/document", data={"target_lang": "DE"}, files=[document], headers=AUTH
        )
        fresh: dict[str, str] = again.json()
        assert await _until(client, fresh, {"done", "error"}) == "done"
        expected: httpx.Response = await client.http.post(
            f"/v2/document/{fresh['document_id']}/result",
            json={"document_key": fresh["document_key"]},
            headers=AUTH,
        )
        assert result.content == expected.content
        assert result.content.count(b"\n\n") == 1


async def test_a_file_waited_for_whose_job_went_elsewhere_is_a_503_not_the_client_s_error(
    start_app: StartApp, fake: FakeControl, data_dir: Path, tmp_path: Path
) -> None:
    # LibreTranslate's translate_file waits for its job in this process. Taken over by another
    # process (this one was thought dead), the job is no longer this request's to finish: a
    # 503 to send it again, not a 400 "Cannot translate file: translating".
    own = own_data(data_dir, tmp_path / "data")
    client = await start_app(loader=fake.loader(delay_s=5.0), warmup=False, data_dir=own)
    waiting = asyncio.ensure_future(
        client.http.post(
            "/libretranslate/translate_file",
            data={"source": "en", "target": "de"},
            files={"file": ("a.txt", b"Hello there.")},
        )
    )
    jobs = sqlite3.connect(own / "documents" / "jobs.sqlite3")
    deadline = time.monotonic() + 30
    while not jobs.execute("SELECT COUNT(*) FROM jobs WHERE state = 'translating'").fetchone()[0]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    jobs.execute("UPDATE jobs SET claim = 'another process'")
    jobs.commit()
    jobs.close()
    response = await waiting
    assert response.status_code == 503, response.text
    assert response.json() == {
        "error": "the service stopped while translating the file; send it again"
    }
