"""A batch's whole life driven task by task without a consumer (tests/unit/jobs/conftest.py), so every state is
seen: validating -> in_progress -> finalizing -> completed, cancelling -> cancelled, expired; lost and duplicated
tasks; files past their retention. Every answer is compared with the single endpoint's, through the app."""

from __future__ import annotations

import threading
import time

import orjson
import pytest

from service.edge import create_app
from service.jobs import batches, chunks, files, finalize, keys, leases, reaping
from service.jobs.context import Jobs
from service.jobs.endpoints import endpoints
from service.operations import answers
from service.operations.catalogue import DEFAULT_NAME
from service.settings import Limits
from tests.harness import slow_encoder_body, wait_for
from tests.unit.jobs.conftest import body_of, build, drain, lines_of, request_line, results, step, submit

MHA = "/v1/multi-head-attention"
# Four answered, three refused by the endpoint (an unknown token, d_model not divisible by n_heads, an unknown field).
BODIES = [
    {"tokens": ["the", "cat", "ate"], "d_model": 8, "n_heads": 2, "seed": 1},
    {"tokens": ["dog"], "d_model": 8, "n_heads": 2},
    {"tokens": ["it", "ate", "food", "the"], "d_model": 8, "n_heads": 4, "causal": True, "seed": 2,
     "return_weights": True},
    {"tokens": ["the", "cat"], "d_model": 7, "n_heads": 2},
    {"tokens": ["food"], "d_model": 4, "n_heads": 1, "decimals": 2},
    {"tokens": ["cat", "it"], "d_model": 16, "n_heads": 4, "positional_encoding": True},
    {"tokens": ["the"], "d_model": 8, "n_heads": 2, "dropout": 0.5},
]


@pytest.fixture(scope="module")
def endpoint():
    """The app's test client: the single endpoints whose answers the batch's lines must equal."""
    return create_app({"TESTING": True}).test_client()


def file_of(bodies: list[dict], url: str = MHA) -> bytes:
    return b"".join(request_line(f"item-{i}", body, url) + b"\n" for i, body in enumerate(bodies))


@pytest.fixture
def checked(endpoint):
    """``checked(jobs, batch, bodies, url)``: each line's response is exactly what ``url`` answers to its body: the
    body, or the status and the problem (pointers relative to the body) with the line's own request_id."""
    def check(jobs: Jobs, batch: dict, bodies: list, url: str = MHA) -> None:
        token = batch["id"].removeprefix("batch_")
        found = results(jobs, batch)
        assert sorted(found) == sorted(f"item-{i}" for i in range(len(bodies)))
        for i, body in enumerate(bodies):
            line = found[f"item-{i}"]
            expected = endpoint.post(url, data=orjson.dumps(body), content_type="application/json")  # null too
            assert line["id"] == f"batch_req_{token}_{i + 1}" and line["error"] is None
            response = line["response"]
            assert response["request_id"] == f"req_{token}_{i + 1}"
            assert response["status_code"] == expected.status_code, (i, response)
            answer = expected.get_json()
            if expected.status_code == 200:
                assert response["body"] == answer, i
            else:
                assert response["body"].pop("request_id") == response["request_id"]
                assert response["body"] == {key: value for key, value in answer.items() if key != "request_id"}, i
    return check


def status(jobs: Jobs, batch_id: str) -> dict:
    return batches.get(jobs, "", batch_id)


def counts(jobs: Jobs, batch_id: str) -> tuple[str, int, int, int]:
    batch = status(jobs, batch_id)
    return batch["status"], *batch["request_counts"].values()


def test_every_state_in_order_with_the_counts_moving_chunk_by_chunk(make_jobs, checked):
    jobs = make_jobs(chunk_items=3)
    batch_id = submit(jobs, file_of(BODIES))
    created = status(jobs, batch_id)
    assert created["status"] == "validating" and created["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert created["expires_at"] == created["created_at"] + 86400
    seen = [counts(jobs, batch_id)]
    while (name := step(jobs)) is not None:
        if name != "reap":
            seen.append(counts(jobs, batch_id))
    assert seen == [("validating", 0, 0, 0), ("in_progress", 7, 0, 0), ("in_progress", 7, 2, 1),
                    ("in_progress", 7, 4, 2), ("finalizing", 7, 4, 3), ("completed", 7, 4, 3)]
    batch = status(jobs, batch_id)
    assert batch["created_at"] <= batch["in_progress_at"] <= batch["finalizing_at"] <= batch["completed_at"]
    assert (batch["failed_at"], batch["expired_at"], batch["cancelling_at"], batch["cancelled_at"], batch["errors"]) \
        == (None, None, None, None, None)
    checked(jobs, batch, BODIES)
    output, errors = (files.get(jobs, "", batch[name]) for name in ("output_file_id", "error_file_id"))
    for file, kind, lines in ((output, "output", 4), (errors, "errors", 3)):
        assert file["purpose"] == "batch_output" and file["filename"] == f"{batch_id}_{kind}.jsonl"
        assert file["bytes"] == len(body_of(jobs, file["id"]))
        assert len(lines_of(jobs, file["id"])) == lines
    assert sorted(path.name for path in jobs.bodies.files.iterdir()) == [batch["input_file_id"]]  # nothing copied


def test_problems_point_into_the_body_as_the_endpoint_answers_them(make_jobs, checked):
    jobs = make_jobs()
    bodies = [{"query": [[1.0, 0.0]], "key": [[1.0, 0.0]], "value": [[2.0]]},
              {"query": [[1.0, True]], "key": [[1.0, 0.0]], "value": [[2.0]]},      # /query/0/1
              {"query": [[1.0, 0.0]], "key": [[1.0, 0.0, 3.0]], "value": [[2.0]]},  # the engine's shape error
              {"query": [[1.0]], "key": [[1.0]], "value": [[1.0]], "mask": [[True, False]]},
              {"query": [[1.0]], "key": [[1.0]]}]
    batch_id = submit(jobs, file_of(bodies, "/v1/attention"), "/v1/attention")
    drain(jobs)
    batch = status(jobs, batch_id)
    assert batch["request_counts"] == {"total": 5, "completed": 1, "failed": 4}
    checked(jobs, batch, bodies, "/v1/attention")
    pointers = {line["custom_id"]: [e["pointer"] for e in line["response"]["body"].get("errors", [])]
                for line in lines_of(jobs, batch["error_file_id"])}
    assert pointers["item-1"] == ["/query/0/1"] and pointers["item-4"] == ["/value"]


def nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_body_that_is_not_an_object_or_nested_too_deep_is_that_item_s_422(make_jobs, checked):
    jobs = make_jobs()
    bodies = [[1, 2], {**BODIES[0], "extra": nested(33)}, BODIES[0], "text", None]
    batch_id = submit(jobs, file_of(bodies))
    drain(jobs)
    batch = status(jobs, batch_id)
    assert batch["request_counts"] == {"total": 5, "completed": 1, "failed": 4}
    checked(jobs, batch, bodies)
    assert results(jobs, batch)["item-1"]["response"]["body"]["limit"] == {"name": "max_json_depth",
                                                                           "maximum": 32, "value": 34}


def test_only_the_body_s_nesting_counts_not_the_line_s(make_jobs):
    jobs = make_jobs()
    batch_id = submit(jobs, request_line("a", BODIES[0], note=nested(200)) + b"\n")
    drain(jobs)
    assert status(jobs, batch_id)["request_counts"] == {"total": 1, "completed": 1, "failed": 0}


def test_cancelled_while_chunks_are_queued_keeps_the_done_chunk(make_jobs, checked):
    jobs = make_jobs(chunk_items=2)
    bodies = [BODIES[0], BODIES[2], BODIES[4], BODIES[5], BODIES[0], BODIES[6]]
    batch_id = submit(jobs, file_of(bodies))
    assert [step(jobs), step(jobs), step(jobs)] == ["reap", "validate", "chunk"]
    assert counts(jobs, batch_id) == ("in_progress", 6, 2, 0)
    cancelling = batches.cancel(jobs, "", batch_id)
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    assert cancelling["request_counts"] == {"total": 6, "completed": 2, "failed": 0}
    assert drain(jobs) == ["finalize", "chunk", "chunk"]  # the queued chunks, run after, do nothing
    batch = status(jobs, batch_id)
    assert batch["status"] == "cancelled" and batch["cancelled_at"] >= batch["cancelling_at"]
    assert batch["completed_at"] is None and batch["request_counts"] == {"total": 6, "completed": 2, "failed": 4}
    found = results(jobs, batch)
    assert sorted(found) == [f"item-{i}" for i in range(6)]
    assert [found[f"item-{i}"]["response"]["status_code"] for i in (0, 1)] == [200, 200]
    for i in range(2, 6):
        assert found[f"item-{i}"]["response"] is None
        assert found[f"item-{i}"]["error"]["code"] == "batch_cancelled"
    with pytest.raises(files.Conflict):
        batches.cancel(jobs, "", batch_id)


def test_cancelled_while_validating_gives_every_request_its_line(make_jobs):
    jobs = make_jobs(chunk_items=2)
    batch_id = submit(jobs, file_of(BODIES))
    assert batches.cancel(jobs, "", batch_id)["status"] == "cancelling"
    assert counts(jobs, batch_id) == ("cancelling", 0, 0, 0)
    assert drain(jobs) == ["reap", "validate", "finalize"]  # no chunk is queued for a stopping batch
    batch = status(jobs, batch_id)
    assert batch["status"] == "cancelled" and batch["request_counts"] == {"total": 7, "completed": 0, "failed": 7}
    assert {line["error"]["code"] for line in results(jobs, batch).values()} == {"batch_cancelled"}
    assert len(results(jobs, batch)) == 7


def test_a_chunk_in_a_worker_s_hands_at_cancellation_finishes_and_is_kept(tmp_path):
    jobs = build(tmp_path / "data", chunk_items=1)
    slow = [{**slow_encoder_body(seed), "n_layers": 2} for seed in (1, 2, 3)]  # ~0.5 s each here: time to cancel
    batch_id = submit(jobs, file_of(slow, "/v1/encoder"), "/v1/encoder")
    assert [step(jobs), step(jobs)] == ["reap", "validate"]
    task = jobs.huey.dequeue()
    worker = threading.Thread(target=jobs.huey.execute, args=(task,))
    worker.start()
    try:  # cancelled once its lease says a worker runs it
        wait_for(lambda: (jobs.store.get(keys.lease(batch_id, "0")) or {}).get("state") == "running", 30,
                 "the chunk's lease taken")
        cancelling = batches.cancel(jobs, "", batch_id)
    finally:
        worker.join()
    assert not jobs.task_errors and cancelling["status"] == "cancelling"
    assert jobs.store.get(keys.event(batch_id, "finalizing")) is None  # not while a lease is live
    assert counts(jobs, batch_id) == ("cancelling", 3, 1, 0)
    reaping.reap(jobs)  # the periodic pass finishes it now that no lease is live
    drain(jobs)
    batch = status(jobs, batch_id)
    assert batch["status"] == "cancelled" and batch["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert results(jobs, batch)["item-0"]["response"]["status_code"] == 200


def test_a_tiny_window_expires_the_batch_with_an_error_line_per_request(make_jobs):
    jobs = make_jobs(chunk_items=2, window_seconds=0.001)
    batch_id = submit(jobs, file_of(BODIES))
    drain(jobs)
    batch = status(jobs, batch_id)
    assert batch["status"] == "expired" and batch["expired_at"] >= batch["expires_at"] == batch["created_at"]
    assert batch["request_counts"] == {"total": 7, "completed": 0, "failed": 7} and batch["output_file_id"] is None
    found = results(jobs, batch)
    assert {line["error"]["code"] for line in found.values()} == {"batch_expired"} and len(found) == 7


def test_a_window_that_runs_out_midway_keeps_the_done_chunks(make_jobs):
    jobs = make_jobs(chunk_items=3)
    batch_id = submit(jobs, file_of(BODIES))
    assert [step(jobs), step(jobs), step(jobs)] == ["reap", "validate", "chunk"]
    record = jobs.store.get(keys.batch(batch_id))
    window_end = int(time.time()) - 1
    jobs.store.put(keys.batch(batch_id), {**record, "expires_at": window_end})  # a day later
    # Past its window the batch reads finalizing, never in_progress: nothing more starts, and the reaper ends it.
    assert drain(jobs) == ["chunk", "chunk"] and counts(jobs, batch_id) == ("finalizing", 7, 2, 1)
    assert status(jobs, batch_id)["finalizing_at"] == window_end
    reaping.reap(jobs)  # expiry is the periodic pass's to see
    assert counts(jobs, batch_id) == ("finalizing", 7, 2, 1)  # claimed expired, its files not written yet
    drain(jobs)
    batch = status(jobs, batch_id)
    assert batch["status"] == "expired" and batch["request_counts"] == {"total": 7, "completed": 2, "failed": 5}
    assert batch["finalizing_at"] == window_end <= batch["expired_at"] and batch["completed_at"] is None
    found = results(jobs, batch)
    assert [found[f"item-{i}"]["response"]["status_code"] for i in range(3)] == [200, 422, 200]
    assert {found[f"item-{i}"]["error"]["code"] for i in range(3, 7)} == {"batch_expired"}


def test_lost_chunks_are_queued_again_by_the_reaper_and_each_custom_id_is_written_once(make_jobs, checked):
    jobs = make_jobs(chunk_items=2)
    batch_id = submit(jobs, file_of(BODIES))
    assert [step(jobs), step(jobs)] == ["reap", "validate"]
    now = time.time()
    # Chunk 0: dequeued by a worker that died before it took the lease (still "queued", long ago).
    assert (lost := jobs.huey.dequeue()).args[:2] == (batch_id, 0)
    jobs.store.put(keys.lease(batch_id, "0"), {"state": "queued", "at": now - 10})
    # Chunk 1: its worker died while running it (a lease that ran out).
    assert jobs.huey.dequeue().args[:2] == (batch_id, 1)
    jobs.store.put(keys.lease(batch_id, "1"), {"state": "running", "at": now - 70, "until": now - 10})
    # Chunk 2: a worker is running it right now: not lost. Chunk 3 is still queued: not lost either.
    assert jobs.huey.dequeue().args[:2] == (batch_id, 2)
    jobs.store.put(keys.lease(batch_id, "2"), {"state": "running", "at": now, "until": now + 60})
    reaping.reap(jobs)
    assert sorted(task.args[:2] for task in jobs.huey.pending() if task.name == "chunk") == [
        (batch_id, 0), (batch_id, 1), (batch_id, 3)]
    assert drain(jobs) == ["chunk", "chunk", "chunk"]
    assert counts(jobs, batch_id) == ("in_progress", 7, 2, 3)  # chunk 2 is not done yet
    chunks.run(jobs, batch_id, 2)  # its worker finishes it, and the batch with it
    assert drain(jobs) == ["finalize"]
    checked(jobs, status(jobs, batch_id), BODIES)
    assert lost.name == "chunk"


def test_a_chunk_run_twice_is_written_and_counted_once(make_jobs, checked):
    jobs = make_jobs(chunk_items=3)
    batch_id = submit(jobs, file_of(BODIES))
    assert [step(jobs), step(jobs)] == ["reap", "validate"]
    barrier = threading.Barrier(2)

    def run() -> None:
        barrier.wait()
        chunks.run(jobs, batch_id, 0)

    twins = [threading.Thread(target=run) for _ in range(2)]
    for twin in twins:
        twin.start()
    for twin in twins:
        twin.join()
    assert sorted(path.name for path in (jobs.bodies.batches / batch_id).iterdir()) == ["0.err", "0.out"]
    jobs.tasks.chunk(batch_id, 0)  # and once more, from the queue
    drain(jobs)
    batch = status(jobs, batch_id)
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 7, "completed": 4, "failed": 3}
    checked(jobs, batch, BODIES)


def test_finalizing_twice_gives_the_same_files_and_counts(make_jobs):
    jobs = make_jobs(chunk_items=2)
    batch_id = submit(jobs, file_of(BODIES))
    drain(jobs)
    batch = status(jobs, batch_id)
    kept = [body_of(jobs, batch[name]) for name in ("output_file_id", "error_file_id")]
    finalize.run(jobs, batch_id)
    reaping.settle(jobs, batch_id, first={})
    assert drain(jobs) == []
    assert status(jobs, batch_id) == batch
    assert [body_of(jobs, batch[name]) for name in ("output_file_id", "error_file_id")] == kept


def test_a_finalizer_run_again_after_a_late_chunk_writes_the_files_first_claimed(make_jobs):
    # The first finalizer claimed what the files hold, then died before their records; meanwhile a worker frozen past
    # its lease finished a chunk of the cancelled batch. Finalizing again must not take that chunk in: its items
    # already have their batch_cancelled lines, and every custom_id is in exactly one file.
    jobs = make_jobs(chunk_items=2)
    batch_id = submit(jobs, file_of([BODIES[0], BODIES[2], BODIES[4], BODIES[5], BODIES[0], BODIES[6]]))
    assert [step(jobs), step(jobs), step(jobs)] == ["reap", "validate", "chunk"]
    batches.cancel(jobs, "", batch_id)
    drain(jobs)
    batch = status(jobs, batch_id)
    kept = [body_of(jobs, batch[name]) for name in ("output_file_id", "error_file_id")]
    jobs.store.delete([keys.event(batch_id, "finalized"),
                       *(keys.file(file_id) for file_id in keys.output_files(batch_id))])
    late = jobs.bodies.chunk(batch_id, 1, "out")
    jobs.bodies.write(late, [request_line("late", BODIES[0])])  # any lines: they must not show
    jobs.store.claim(keys.chunk(batch_id, 1), {"completed": 1, "failed": 0})
    finalize.run(jobs, batch_id)
    assert status(jobs, batch_id) == batch
    assert [body_of(jobs, batch[name]) for name in ("output_file_id", "error_file_id")] == kept
    assert sorted(results(jobs, batch)) == [f"item-{i}" for i in range(6)]


def test_deleting_a_batch_s_files_removes_its_results(make_jobs):
    jobs = make_jobs(chunk_items=2)
    batch_id = submit(jobs, file_of(BODIES))
    drain(jobs)
    batch = status(jobs, batch_id)
    files.delete(jobs, "", batch["output_file_id"])
    left = sorted(path.name for path in (jobs.bodies.batches / batch["id"]).iterdir())
    assert left and all(name.endswith(".err") or name.endswith(".out") for name in left)  # the error file's
    assert len(lines_of(jobs, batch["error_file_id"])) == 3
    files.delete(jobs, "", batch["error_file_id"])
    assert not (jobs.bodies.batches / batch["id"]).exists()  # the empty results and all


def test_past_their_retention_files_and_finished_batches_go_unless_an_unfinished_batch_reads_them(make_jobs):
    jobs = make_jobs(limits=Limits(file_retention_seconds=1))
    finished = submit(jobs, file_of(BODIES[:2]))
    drain(jobs)
    running = submit(jobs, file_of(BODIES[2:4]))  # validating: no worker has run it yet
    unused = files.save(jobs, [b"{}\n"])[0]
    files.record(jobs, "", unused, 3, "input.jsonl", "batch")
    done, waiting = status(jobs, finished), status(jobs, running)
    wait_for(lambda: time.time() >= done["completed_at"] + 2, 5, "the retention's end")  # 1 s, in whole seconds
    young = files.save(jobs, [b"{}\n"])[0]
    files.record(jobs, "", young, 3, "input.jsonl", "batch")
    reaping.reap(jobs)
    # The finished batch went with its files and results, 404 as if it never was; the unfinished one's input stays.
    with pytest.raises(files.NotFound):
        batches.get(jobs, "", finished)
    assert [batch["id"] for batch in batches.listing(jobs, "", 10, None)["data"]] == [running]
    kept = {key.removeprefix("file:") for key, _ in jobs.store.scan("file:")}
    assert kept == {waiting["input_file_id"], young}
    assert {file["id"] for file in files.listing(jobs, "", 10, None, None)["data"]} == kept
    assert sorted(path.name for path in jobs.bodies.files.iterdir()) == sorted(kept)
    assert not (jobs.bodies.batches / finished).exists()
    assert not [key for key, _ in jobs.store.scan(f"job:{finished}:")] and jobs.store.get(keys.batch(finished)) is None
    drain(jobs)
    ended = status(jobs, running)
    assert ended["status"] == "completed"
    wait_for(lambda: time.time() >= ended["completed_at"] + 2, 5, "the retention's end")
    reaping.reap(jobs)  # now that no batch reads it, and its own retention is over too
    assert list(jobs.store.scan("file:")) == [] and list(jobs.store.scan("batch:")) == []
    assert list(jobs.store.scan("job:")) == [] and not list(jobs.bodies.files.iterdir())
    for index in (keys.OPEN, keys.DUE, keys.owned("files", ""), keys.owned("batches", "")):
        assert jobs.store.members(index) == [], index
    with pytest.raises(files.NotFound):
        files.get(jobs, "", waiting["input_file_id"])


def test_a_reap_reads_the_unfinished_batches_never_the_finished_ones_nor_the_whole_queue(make_jobs, monkeypatch):
    jobs = make_jobs(chunk_items=1)
    read: list[str] = []
    for name in ("get_many", "members"):
        method = getattr(jobs.store, name)
        monkeypatch.setattr(jobs.store, name, lambda *args, _method=method, **kwargs: (
            read.append(repr(args[0])), _method(*args, **kwargs))[1])
    monkeypatch.setattr(jobs.huey, "pending", lambda *args: pytest.fail("the reaper read the whole queue"))
    heads = []
    monkeypatch.setattr(jobs.huey, "deserialize_task", lambda data, _method=jobs.huey.deserialize_task: (
        heads.append(data), _method(data))[1])

    def reaped() -> tuple[int, int]:
        """The store's reads and the queue's tasks deserialised by one reap."""
        read.clear(), heads.clear()
        reaping.reap(jobs)
        return len(read), len(heads)

    running = submit(jobs, file_of(BODIES[:3]))
    assert [step(jobs), step(jobs)] == ["reap", "validate"]
    taken = [jobs.huey.dequeue() for _ in range(3)]  # its 3 chunks in (live) workers' hands all along
    for task in taken:
        jobs.store.put(keys.lease(running, str(task.args[1])), {"state": "running", "at": time.time(),
                                                                 "until": time.time() + 3600})
    seen = [reaped()]
    for count in (1, 10):  # finished batches in the store besides the running one
        while len(list(jobs.store.scan("batch:"))) < count + 1:
            finished = submit(jobs, file_of(BODIES[:1]))
            assert drain(jobs) == ["validate", "chunk", "finalize"]
            assert status(jobs, finished)["status"] == "completed"
        assert status(jobs, running)["status"] == "in_progress"
        seen.append(reaped())
    assert seen[0] == seen[1] == seen[2], seen  # as many reads with 10 finished batches as with none
    assert seen[0][1] <= len(leases.PRIORITIES)  # the first task of each priority at most
    for task in taken:
        jobs.huey.enqueue(task)
    drain(jobs)
    assert status(jobs, running)["status"] == "completed"


@pytest.mark.parametrize(("operation", "options"), [
    ("attention", {}),
    ("explain", {"methods": ["rollout", "flow", "norms"]}),  # the analyses: a corpus explained in the background
])
def test_the_model_endpoints_are_batch_endpoints_and_their_url_names_the_model(make_jobs, checked, operation,
                                                                              options):
    url = f"/v1/models/{DEFAULT_NAME}/{operation}"
    if url not in endpoints():
        pytest.skip(f"the model {DEFAULT_NAME} is not installed")
    jobs = make_jobs()
    bodies = [{"text": "the dog ate", "layers": [0], "heads": [0], "decimals": 3, **options},
              {"text": "a cat sat", "text_pair": "on the mat", "layers": [5], "heads": [1, 2], **options},
              {"text": "the dog ate", "model": DEFAULT_NAME, **options},  # the url gives it: the endpoint refuses it
              {"text": 5, "model": "other"}]
    batch_id = submit(jobs, file_of(bodies, url), url)
    drain(jobs)
    batch = status(jobs, batch_id)
    assert batch["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    checked(jobs, batch, bodies, url)
    refused = results(jobs, batch)["item-2"]["response"]["body"]
    assert refused["errors"] == [{"pointer": "/model", "detail": "Unknown field."}]


@pytest.mark.parametrize(("maximum", "runs"), [(30000, [2, 2, 2]), (10000, [1] * 6)])
def test_items_past_max_batch_elements_together_are_computed_in_several_runs(make_jobs, checked, maximum, runs):
    bodies = [{"tokens": ["the", "cat", "ate", "food", "it"] * 4, "d_model": 32, "n_heads": 4, "seed": i % 2}
              for i in range(6)]
    jobs = make_jobs(limits=Limits(max_batch_elements=maximum))
    refused, sized = answers.size([("multi-head-attention", body) for body in bodies], jobs.limits, lambda i: ())
    assert refused == [None] * 6  # each within its own limits, even past max_batch_elements alone
    assert [len(run) for run in answers.budgets(sized, maximum)] == runs
    batch_id = submit(jobs, file_of(bodies))
    drain(jobs)
    batch = status(jobs, batch_id)
    assert batch["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    checked(jobs, batch, bodies)


def test_a_store_from_before_the_indexes_is_indexed_once_as_it_would_have_been(make_jobs):
    jobs = make_jobs(chunk_items=2)
    finished = submit(jobs, file_of(BODIES[:2]))
    drain(jobs)
    running = submit(jobs, file_of(BODIES[:3]))
    indexes = (keys.OPEN, keys.DUE, keys.owned("files", ""), keys.owned("batches", ""))
    kept = {index: jobs.store.members(index) for index in indexes}
    assert kept[keys.OPEN] == [running] and len(kept[keys.owned("files", "")]) == 4  # 2 inputs, output and errors
    jobs.store.commit(remove=kept)  # the version before wrote no index
    reaping.reindex(jobs)
    assert {index: jobs.store.members(index) for index in indexes} == kept
    jobs.store.commit(remove={keys.OPEN: [running]})
    reaping.reindex(jobs)  # once per store
    assert jobs.store.members(keys.OPEN) == []
    assert {batch["id"] for batch in batches.listing(jobs, "", 10, None)["data"]} == {running, finished}
