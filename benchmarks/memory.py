"""Benchmark: what a deployment serving both packaged models costs, in start-up time and memory.

Run:  .venv/bin/python benchmarks/memory.py                 (about 1 min)
      .venv/bin/python benchmarks/memory.py --starts 5 --requests 40

Two parts, each printed as a table:
  1. start-up  the real gunicorn (service/gunicorn.conf.py, WEB_CONCURRENCY=2, ATTENTION_MODELS unset: MiniLM and
               SmolLM2-135M-Instruct, loaded in the master before the fork) from its exec to /healthz answering with
               both workers up, ``--starts`` times in a row: each time, its median and largest. Target: <= 10 s.
  2. memory    that instance and one job worker (``python -m service.jobs.worker`` on the same SQLite queue), the
               way compose and Kubernetes run them, after work that touches everything: ``--requests`` requests of
               each model spread over both web workers (4 clients at once; a 128-token text, every head of as many
               layers as the default max_weight_elements lets one answer hold: MiniLM's 6, the decoder's 15),
               then one batch job per model (the job worker loads each model when a batch first names it). Then
               /proc/PID/smaps_rollup of each process (benchmarks/model.py's table: RSS counts a shared page in
               every process that maps it, PSS splits it between them, so only PSS sums to what the processes cost)
               and each one's peak RSS (VmHWM). The compose, Kubernetes and KServe memory limits are set from these:
               the web container holds the master and its workers, the job worker's container itself.
This is a benchmark, not a test: nothing asserts timings and a MISS does not change the exit code.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's service/ and tests/, before any installed copy

from benchmarks.model import print_memory, smaps_rollup  # noqa: E402
from service.operations import catalogue  # noqa: E402
from tests.harness import Gunicorn  # noqa: E402
from tests.live.jobs import ENDED, Worker, create, memory_kib, queue_env, request_line, upload, wait_batch  # noqa: E402

TARGET_START_S = 10.0
MODELS = ",".join(catalogue.DEFAULTS)  # as ATTENTION_MODELS unset serves them
TEXT = (  # the first 128 tokens of this for each model (benchmarks/decoder.py's paragraph)
    "A teacher wants to show her students what a trained model looks at when it reads a sentence, so she types one "
    "in and picks a layer and a head. Each row of the heatmap is a word asking a question, each column a word that "
    "may answer it, and the colour says how much attention the question pays to the answer. In the early layers "
    "most heads look at the next or the previous word; later on, some heads link a pronoun to the noun it stands "
    "for, or a verb to its subject, and a few spend almost all of their attention on the first token of the text.")
BATCH_ITEMS = 8
# The most weights max_weight_elements lets a 128-token answer hold: all of MiniLM's, the decoder's first 15 layers.
LAYERS = {"smollm2-135m-instruct": list(range(15))}


def start_up(starts: int) -> None:
    """Part 1: exec to ready, ``starts`` times."""
    seconds = []
    for _ in range(starts):
        began = time.monotonic()
        with Gunicorn({"ATTENTION_MODELS": MODELS}, workers=2):
            seconds.append(time.monotonic() - began)
    worst = max(seconds)
    print(f"1. start-up: gunicorn, 2 workers, ATTENTION_MODELS={MODELS}: exec to ready over {starts} starts: median "
          f"{statistics.median(seconds):.2f} s, largest {worst:.2f} s "
          f"({'PASS' if worst <= TARGET_START_S else 'MISS'}: target <= {TARGET_START_S:.0f} s)")


def exercise(url: str, count: int) -> None:
    """``count`` requests of each model, 4 at once, so both sync workers serve both."""
    bodies = [(name, {"text": TEXT} | ({"layers": LAYERS[name]} if name in LAYERS else {}))
              for name in catalogue.DEFAULTS] * count

    def post(item: tuple[str, dict]) -> int:
        name, body = item
        return requests.post(f"{url}/v1/models/{name}/attention", json=body, timeout=120).status_code

    with ThreadPoolExecutor(4) as pool:
        statuses = set(pool.map(post, bodies))
    assert statuses == {200}, statuses


def batch_jobs(url: str) -> None:
    """One batch job per model, waited for: the job worker loads each model as its first batch names it."""
    for name in catalogue.DEFAULTS:
        endpoint = f"/v1/models/{name}/attention"
        content = b"".join(request_line(f"item-{i}", {"text": TEXT, "layers": [0]}, endpoint)
                           for i in range(BATCH_ITEMS))
        found = wait_batch(url, create(url, upload(url, content)["id"], endpoint)["id"],
                           lambda batch: batch["status"] in ENDED, 300)
        assert found["status"] == "completed" and found["request_counts"]["failed"] == 0, found


def memory(count: int) -> None:
    """Part 2: the web instance and a job worker after work, per process."""
    with tempfile.TemporaryDirectory(prefix="attention-memory-") as data:
        env = queue_env(Path(data), ATTENTION_MODELS=MODELS, GUNICORN_MAX_REQUESTS="1000000")
        with Gunicorn(env, workers=2) as server, Worker(env) as worker:
            worker.ready()
            exercise(server.url, count)
            batch_jobs(server.url)
            processes = [("master", server.pid), *(("worker", pid) for pid in sorted(server.workers())),
                         ("job", worker.process.pid)]
            rows = [(role, pid, smaps_rollup(pid)) for role, pid in processes]
            peaks = {pid: memory_kib(pid, "VmHWM") for _, pid in processes}
    print(f"\n2. memory: the instance above and one job worker, after {count} requests of each model (128 "
          f"tokens, every head of MiniLM's 6 layers, of the decoder's first 15) and a batch job of {BATCH_ITEMS} "
          "items per model")
    print_memory(rows, "per process")
    web = [row for row in rows if row[0] != "job"]
    web_pss = sum(fields["Pss"] for _, _, fields in web) / 1024
    job_pss = next(fields["Pss"] for role, _, fields in rows if role == "job") / 1024
    print(f"   the web container (master + 2 workers): PSS {web_pss:.0f} MiB; the job worker's: PSS {job_pss:.0f} MiB")
    print("   peak RSS (VmHWM), MiB: " + ", ".join(f"{role} {pid} {peaks[pid] / 1024:.0f}" for role, pid in processes))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=3, help="gunicorn starts timed in part 1 (3)")
    parser.add_argument("--requests", type=int, default=20, help="requests of each model in part 2 (20)")
    args = parser.parse_args(argv)
    print(f"cpus {os.cpu_count()}, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    start_up(args.starts)
    memory(args.requests)


if __name__ == "__main__":
    main()
