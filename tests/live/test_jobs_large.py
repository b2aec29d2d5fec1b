"""A large batch holds no more memory than a small one (issue 35): 50,000 of the smallest items against 2,000, each
through fresh processes (a real gunicorn with one web worker, one ``python -m service.jobs.worker``; no trained model
served, whose load would set both peaks), on SQLite. The
upload streams to disk, validation reads the file line by line, chunks are read back by byte range, and the output
streams from the chunks' results: the peak RSS (VmHWM) of the web worker and of the job worker stays within 1.3x.
benchmarks/jobs.py --large measures the same at 200,000 items, with items/s."""

from __future__ import annotations

from pathlib import Path

import requests

from tests.harness import Gunicorn
from tests.live.jobs import Worker, create, ended, memory_kib, queue_env, small_file, upload, wait_batch

SIZES = (2_000, 50_000)
RATIO = 1.3


def peaks(data_dir: Path, count: int) -> dict[str, int]:
    """The peak RSS (KiB) of a fresh web worker and a fresh job worker that ran a ``count``-item batch, checked
    complete, and served its output."""
    env = queue_env(data_dir, ATTENTION_MODELS="")  # no trained model: its load's peak would hide ~90 MB of growth
    with Worker(env) as worker, Gunicorn(env, workers=1) as api:
        worker.ready()
        created = create(api.url, upload(api.url, small_file(count))["id"], "/v1/attention")
        done = wait_batch(api.url, created["id"], ended, 300)
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": count, "completed": count, "failed": 0}
        with requests.get(f"{api.url}/v1/files/{done['output_file_id']}/content", timeout=60, stream=True) as out:
            assert out.status_code == 200
            assert sum(chunk.count(b"\n") for chunk in out.iter_content(1 << 20)) == count
        [web] = api.workers()
        return {"web worker": memory_kib(web, "VmHWM"), "job worker": worker.memory_kib("VmHWM")}


def test_a_50000_item_batch_costs_the_memory_of_a_2000_item_one(tmp_path):
    small, large = (peaks(tmp_path / str(count), count) for count in SIZES)
    ratios = {name: large[name] / small[name] for name in small}
    print("\npeak RSS, 50,000 items / 2,000: " + ", ".join(
        f"{name} {large[name] / 1024:.0f} / {small[name] / 1024:.0f} MiB = {ratio:.2f}x"
        for name, ratio in ratios.items()))
    assert all(ratio <= RATIO for ratio in ratios.values()), ratios
