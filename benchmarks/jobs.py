"""Benchmark of the batch jobs (issue 22): items/s through /v1/batches with 1 and 2 workers vs /v1/batch.

Run:  .venv/bin/python benchmarks/jobs.py                  (about 3 minutes; the SQLite queue)
      .venv/bin/python benchmarks/jobs.py --redis          (redis-server on a loopback port, started and stopped here)
      .venv/bin/python benchmarks/jobs.py --rounds 6 --items 20000
      .venv/bin/python benchmarks/jobs.py --history [--redis]   (issue 35: what history costs; see history())
      .venv/bin/python benchmarks/jobs.py --large [--redis]     (issue 35: 200,000 small items; see large())

One real gunicorn (service/gunicorn.conf.py, one sync web worker, ATTENTION_EMBEDDED_WORKERS=0, a fresh
ATTENTION_DATA_DIR) and, for the jobs, ``python -m service.jobs.worker`` processes started here, fresh for each
measurement and warmed up by a 512-item batch of their own. One client sends ``--items`` demo-5 items
(POST /v1/multi-head-attention bodies of the seed's demo 5, the sentence rotated per item) three ways per round,
their order rotating from round to round so that drift on this shared machine hits each:
  batch      /v1/batch in 256-item requests, one after another: from the first request sent to the last answer
             received.
  1 worker   the same items as one file: upload it, create the batch, GET /v1/batches/{id} every POLL seconds
  2 workers  until it has ended, download the output file: from the upload's first byte to the output's last
             (the client's whole wait; it includes up to one POLL interval).
Answers are parsed and checked once the clock has stopped (parsing 23 MB of floats costs this client ~1 s, as
much as the work measured): every job's output holds each custom_id exactly once, each answer equal to /v1/batch's.

The machine has 2 cores, shared with whatever else runs: the API and this client run beside the workers, so two
workers never have two whole cores. Each measurement therefore also prints, per 1000 items, the CPU time of the
web worker, the client and the job workers, and how long each waited, runnable, for a CPU (/proc schedstat):
CPU per item is what the design costs, the waiting is what the machine did to the wall-clock figures. And each
round starts by timing a CPU-bound loop in one process, then in two at once: what this machine gives two processes
now (2.0 on two free cores; on this shared one it was often ~1.0), against which two workers' gain is read. Also: the
serial phases of a job (upload, validation, finalizing, download) and the best two workers could do given them
(Amdahl); submit -> in_progress of 5-item batches sent one at a time to an idle worker (polled every 10 ms); GET
/metrics with an empty store and with ``--census`` batches in it (the batch-job census reads them all at each
scrape). Targets: one worker >= 0.8x /v1/batch's items/s, two workers >= 1.7x one (medians of the rounds' paired
ratios, with a 95% interval from 6 rounds on), the scrape with the census < 50 ms. A benchmark: nothing asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import requests
from prometheus_client.parser import text_string_to_metric_families

if __package__ in (None, ""):  # run as a script: make the repo root importable (service/)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from benchmarks.batch import JSON, demo5_items
from benchmarks.http_load import median_interval
from tests.harness import ROOT, Gunicorn, RedisServer, wait_for
from tests.live.jobs import memory_kib, small_file

ENDPOINT = "/v1/multi-head-attention"
BATCH_ITEMS = 256  # /v1/batch's max_batch_items
POLL = 0.05  # seconds between the client's looks at its batch: at most that late on a 1-3 s job, ~1 ms of API each
ENDED = ("completed", "failed", "expired", "cancelled")
TIMEOUT = 120  # seconds: any one wait, bounded even if a worker misbehaves
NDJSON = {"Content-Type": "application/x-ndjson"}
# A fixed CPU-bound loop (~0.4 s here) that a process times itself: what this machine gives two processes at once.
SPIN = "import time\nstart = time.perf_counter()\nx = 0\nfor i in range(2_000_000): x += i * i\n" \
       "print(time.perf_counter() - start)"


class Workers:
    """``count`` ``python -m service.jobs.worker`` processes, each in its own session with its log in ``logs``,
    until the ``with`` ends (SIGINT: Huey's graceful stop; SIGKILL to the process group after 20 s)."""

    def __init__(self, count: int, env: dict[str, str], logs: Path) -> None:
        self.started: list[tuple[subprocess.Popen, Path]] = []
        for _ in range(count):
            log = Path(tempfile.mkstemp(dir=logs, prefix="worker-", suffix=".log")[1])
            with log.open("wb") as out:
                self.started.append((subprocess.Popen([sys.executable, "-m", "service.jobs.worker"], cwd=ROOT,
                                                      env=env, stdout=out, stderr=subprocess.STDOUT,
                                                      start_new_session=True), log))
        for process, log in self.started:
            wait_for(lambda p=process, path=log: _consuming(p, path), 60, f"worker {process.pid} to start")
        self.marks = [0] * count

    def mark(self) -> None:
        """From now on :meth:`task_seconds` reads only what the workers log after this (not the warm-up's)."""
        self.marks = [log.stat().st_size for _, log in self.started]

    def task_seconds(self, task: str) -> list[float]:
        """How long each ``task`` (chunk, validate, finalize) since the :meth:`mark` took, as Huey logged it
        (``... executed in 0.052s``), every worker's."""
        return [float(seconds) for (_, log), mark in zip(self.started, self.marks, strict=True)
                for seconds in re.findall(rf"tasks\.{task}: \S+(?: p=\S+)? executed in ([0-9.]+)s",
                                          log.read_bytes()[mark:].decode(errors="replace"))]

    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [process.pid for process, _ in self.started]

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for process, _ in self.started:
            process.send_signal(signal.SIGINT)
        for process, _ in self.started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)


def _consuming(process: subprocess.Popen, log: Path) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"worker {process.pid} exited: {log.read_text()[-2000:]}")
    return "Huey consumer started" in log.read_text()


def usage(pids: list[int]) -> np.ndarray:
    """[CPU seconds used, seconds spent runnable but waiting for a CPU] of the processes ``pids`` so far: their
    utime + stime (/proc/<pid>/stat, ended threads included) and their live threads' run delay
    (/proc/<pid>/task/*/schedstat). The second says how much of a wait was the machine being busy."""
    cpu = waited = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # the line's fields 14 and 15
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
                waited += int((task / "schedstat").read_text().split()[1]) / 1e9
    return np.array([cpu, waited])


def spinning(count: int) -> float:
    """Seconds the slowest of ``count`` processes started together took for :data:`SPIN`."""
    processes = [subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
                 for _ in range(count)]
    return max(float(process.communicate(timeout=TIMEOUT)[0]) for process in processes)


def machine_scaling() -> float:
    """Two CPU-bound processes' throughput against one's, on this machine now (2.0: two free cores; the
    neighbours' load takes its share): the most two job workers could gain over one."""
    return 2 * spinning(1) / spinning(2)


def ndjson(bodies: list[dict[str, Any]]) -> bytes:
    """A batch's input file: one request line per body, custom_id ``i<index>``."""
    return b"".join(orjson.dumps({"custom_id": f"i{i}", "method": "POST", "url": ENDPOINT, "body": body}) + b"\n"
                    for i, body in enumerate(bodies))


def through_batch(session: requests.Session, url: str, bodies: list[dict[str, Any]]) -> list[bytes]:
    """/v1/batch's answers to ``bodies``, 256 a request, one request after another, as received (parsed by
    :func:`batch_answers` once the clock has stopped)."""
    answers = []
    for start in range(0, len(bodies), BATCH_ITEMS):
        requests_ = [{"id": str(i), "op": "multi-head-attention", "body": body}
                     for i, body in enumerate(bodies[start:start + BATCH_ITEMS])]
        response = session.post(f"{url}/v1/batch", data=orjson.dumps({"requests": requests_}), headers=JSON,
                                timeout=TIMEOUT, stream=True)
        answers.append(received(response))
    return answers


def received(response: requests.Response) -> bytes:
    """The body of a streamed ``response`` (a 2xx), read in 1 MiB blocks as a speed-minded client reads: requests'
    ``.content`` reads 10 KiB at a time, ~2.7 ms per MB here (62 ms of a 23 MB output; 17 ms in 1 MiB blocks)."""
    response.raise_for_status()
    return b"".join(response.iter_content(1 << 20))


def batch_answers(received: list[bytes]) -> list[Any]:
    """The bodies of /v1/batch's answers, every one a 200."""
    answers = [answer for content in received for answer in orjson.loads(content)["responses"]]
    assert all(answer["status"] == 200 for answer in answers), [a for a in answers if a["status"] != 200][:2]
    return [answer["body"] for answer in answers]


def submit(session: requests.Session, url: str, content: bytes, endpoint: str = ENDPOINT) -> dict[str, Any]:
    """Upload ``content`` and create its batch: the batch object."""
    file = session.post(f"{url}/v1/files?purpose=batch", data=content, headers=NDJSON, timeout=TIMEOUT)
    file.raise_for_status()
    created = session.post(f"{url}/v1/batches", json={"input_file_id": file.json()["id"], "endpoint": endpoint,
                                                      "completion_window": "24h"}, timeout=TIMEOUT)
    created.raise_for_status()
    return created.json()


def until(session: requests.Session, url: str, batch_id: str, done: tuple[str, ...], every: float) -> dict:
    """GET the batch every ``every`` seconds until its status is one of ``done``: the batch object then."""
    deadline = time.monotonic() + TIMEOUT
    while (current := session.get(f"{url}/v1/batches/{batch_id}", timeout=TIMEOUT).json())["status"] not in done:
        assert time.monotonic() < deadline, f"batch {batch_id} still {current['status']} after {TIMEOUT} s"
        time.sleep(every)
    return current


def through_jobs(session: requests.Session, url: str, content: bytes, endpoint: str = ENDPOINT) -> dict[str, Any]:
    """The file ``content`` through a batch job: its output file as received (parsed by :func:`check` once the
    clock has stopped), and its phases' seconds."""
    started = time.perf_counter()
    batch_id = submit(session, url, content, endpoint)["id"]
    submitted = time.perf_counter()
    ended = until(session, url, batch_id, ENDED, POLL)
    finished = time.perf_counter()
    assert ended["status"] == "completed" and not ended["error_file_id"], ended
    output = received(session.get(f"{url}/v1/files/{ended['output_file_id']}/content", timeout=TIMEOUT,
                                  stream=True))
    done = time.perf_counter()
    return {"output": output, "seconds": done - started, "submit": submitted - started,
            "wait": finished - submitted, "download": done - finished}


def check(job: dict[str, Any], expected: list[Any]) -> None:
    """Each custom_id exactly once in the job's output, each answer /v1/batch's for the same item."""
    lines = job.pop("output").splitlines()
    answers = {result["custom_id"]: result["response"]["body"] for result in map(orjson.loads, lines)}
    assert len(lines) == len(answers) == len(expected), (len(lines), len(answers), len(expected))
    assert answers == {f"i{i}": answer for i, answer in enumerate(expected)}, "answers differ from /v1/batch's"


def to_in_progress(session: requests.Session, url: str, count: int) -> list[float]:
    """Seconds from POST /v1/batches to the first GET no longer ``validating``, of ``count`` 5-item batches, each
    submitted (its file uploaded first) once the last has ended and the worker has idled for a second."""
    content = ndjson(demo5_items(5))
    seconds = []
    for _ in range(count):
        time.sleep(1.0)  # an idle worker: its polls have backed off to their longest interval
        file = session.post(f"{url}/v1/files?purpose=batch", data=content, headers=NDJSON, timeout=TIMEOUT).json()
        started = time.perf_counter()
        created = session.post(f"{url}/v1/batches", json={"input_file_id": file["id"], "endpoint": ENDPOINT,
                                                          "completion_window": "24h"}, timeout=TIMEOUT).json()
        until(session, url, created["id"], ("in_progress", "finalizing", *ENDED), 0.01)
        seconds.append(time.perf_counter() - started)
        until(session, url, created["id"], ENDED, 0.05)
    return seconds


def scrape(session: requests.Session, url: str, repeats: int = 21) -> tuple[list[float], str]:
    """GET /metrics ``repeats`` times: the seconds of each, and the batch-job census of the last."""
    times, text = [], ""
    for _ in range(repeats):
        started = time.perf_counter()
        text = session.get(f"{url}/metrics", timeout=TIMEOUT).text
        times.append(time.perf_counter() - started)
    return times, "\n".join(line for line in text.splitlines()
                            if line.startswith("batch_") and not line.startswith("batch_items"))


def fill(session: requests.Session, url: str, batches: int) -> None:
    """One-item batches until the store holds ``batches`` batches, all of them ended."""
    metrics = session.get(f"{url}/metrics", timeout=TIMEOUT).text
    held = sum(sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
               if sample.name == "batch_jobs")
    content = ndjson(demo5_items(1))
    made = [submit(session, url, content)["id"] for _ in range(max(0, batches - int(held)))]
    for batch_id in made:
        until(session, url, batch_id, ENDED, 0.1)


def interval(values: list[float]) -> str:
    """The 95% interval of the median of ``values``, as words (benchmarks/http_load.py's sign-test interval)."""
    found = median_interval(values)
    return f"95% interval {found[0]:.2f}-{found[1]:.2f}" if found else "too few rounds for an interval"


def clone(jobs: Any, template: str, count: int) -> None:
    """``count`` copies of the finished batch ``template`` (its records, events, chunks' counts and output and error
    file records, each under a new id; their bodies shared) written through the store as the service writes a
    finished batch, with its index members: history, seeded in seconds rather than run for hours."""
    from service.jobs import files, keys, records

    batch = records.read(jobs, template, counts=True)
    names = [*records.keys_of(batch), *(keys.file(file_id) for file_id in keys.output_files(template))]
    found = {key: value for key, value in zip(names, jobs.store.get_many(names), strict=True) if value is not None}
    text, token = orjson.dumps(found), template.removeprefix("batch_").encode()
    for start in range(0, count, 500):  # one transaction per 500 batches
        put: dict[str, Any] = {}
        add: dict[str, list[str]] = {}
        for _ in range(min(500, count - start)):
            copied = orjson.loads(text.replace(token, os.urandom(12).hex().encode()))
            put.update(copied)
            [batch_id] = [key.removeprefix("batch:") for key in copied if key.startswith("batch:")]
            copy = records.Batch(copied[keys.batch(batch_id)],
                                 *(copied.get(keys.event(batch_id, name)) for name in records.EVENTS), counts={})
            outputs = [copied[keys.file(file_id)] for file_id in keys.output_files(batch_id)
                       if keys.file(file_id) in copied]
            members = [(keys.owned("batches", copy.record["owner"]),
                        [keys.timed(copy.record["created_at"], batch_id)]),
                       (keys.DUE, [records.due(jobs, copy)]),
                       *(item for file in outputs for item in files.listed(file).items())]
            for index, listed in members:
                add.setdefault(index, []).extend(listed)
        jobs.store.commit(put=put, add=add)


def history(args: argparse.Namespace) -> None:
    """What history costs (issue 35): two stacks side by side, each one gunicorn (one web worker) and one job worker
    on a store of its own, one holding ``--few`` finished batches, the other ``--many`` (10,000: copies of a real
    finished batch, written through the store: :func:`clone`). In each of ``--rounds`` rounds, the stacks in turn
    (the order alternating): a reap (service.jobs.reaping.reap, in this process on the stack's store: a run of the
    reaper's chain, timed 20 times), GET /v1/batches?limit=20 (the first page, 20 times) and a new 5-item batch's
    submit -> in_progress (7 times, the worker idle for a second first; :func:`to_in_progress`). Reported: the
    medians, and many/few of each round's medians (target: within 1.5x)."""
    from service.jobs import queue, reaping
    from service.settings import JobSettings, Limits

    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-history-")))
        stacks = {}
        for name, count in (("few", args.few), ("many", args.many)):
            env = {**os.environ, "ATTENTION_DATA_DIR": str(workdir / name), "ATTENTION_EMBEDDED_WORKERS": "0",
                   "GUNICORN_MAX_REQUESTS": "1000000"}
            env.pop("ATTENTION_QUEUE_URL", None)
            if args.redis:
                env["ATTENTION_QUEUE_URL"] = stack.enter_context(RedisServer()).url
            server = stack.enter_context(Gunicorn(env, workers=1))
            stack.enter_context(Workers(1, env, workdir))
            session = stack.enter_context(requests.Session())
            jobs = queue.build(JobSettings(data_dir=workdir / name, queue_url=env.get("ATTENTION_QUEUE_URL")), Limits())
            template = through_template(session, server.url)
            started = time.perf_counter()
            clone(jobs, template, count - 1)
            print(f"{name}: {count} finished batches in the store ({time.perf_counter() - started:.1f} s to seed)")
            stacks[name] = (server, session, jobs)
        times: dict[str, dict[str, list[float]]] = {name: {"reap": [], "list": [], "submit": []} for name in stacks}
        for round_ in range(args.rounds):
            for name in (["few", "many"] if round_ % 2 == 0 else ["many", "few"]):
                server, session, jobs = stacks[name]
                times[name]["reap"].append(statistics.median(timed(lambda j=jobs: reaping.reap(j), 20)))
                first_page = f"{server.url}/v1/batches?limit=20"
                times[name]["list"].append(statistics.median(timed(
                    lambda s=session, u=first_page: s.get(u, timeout=TIMEOUT).raise_for_status(), 20)))
                times[name]["submit"].append(statistics.median(to_in_progress(session, server.url, 7)))
    for what in ("reap", "list", "submit"):
        few, many = times["few"][what], times["many"][what]
        ratios = [m / f for m, f in zip(many, few, strict=True)]
        print(f"{what:6}: {args.few} batches {statistics.median(few) * 1e3:.2f} ms, {args.many} "
              f"{statistics.median(many) * 1e3:.2f} ms; {args.many}/{args.few} {statistics.median(ratios):.2f}x "
              f"(per round {', '.join(f'{r:.2f}' for r in ratios)}; {interval(ratios)}); target <= 1.5x: "
              f"{'PASS' if statistics.median(ratios) <= 1.5 else 'MISS'}")


LARGE_ITEMS = 200_000


def large(args: argparse.Namespace) -> None:
    """Large batches stay flat (issue 35): ``--large-items`` (200,000) of /v1/attention's smallest items against
    ``--items`` (10,000), with ATTENTION_MAX_JOB_REQUESTS raised to fit, and no trained model served (its load
    would set every peak, hiding ~90 MB of growth). Each measurement starts fresh processes
    (one gunicorn with one web worker, two job workers), so each one's peak RSS (VmHWM) is that batch's: the clock
    runs from the upload's first byte to the output's last (:func:`through_jobs`); every custom_id is then checked
    once in the output, every answer a 200. The sizes alternate from round to round. Targets: items/s of the large
    batch >= 0.8x the small one's, and the peak RSS of the web worker and of each job worker <= 1.3x (medians of the
    rounds' paired ratios)."""
    sizes = {"small": args.items, "large": args.large_items}
    env = {**os.environ, "ATTENTION_EMBEDDED_WORKERS": "0", "GUNICORN_MAX_REQUESTS": "1000000",
           "ATTENTION_MAX_JOB_REQUESTS": str(max(sizes.values())), "ATTENTION_MODELS": ""}
    env.pop("ATTENTION_QUEUE_URL", None)
    contents = {name: small_file(count) for name, count in sizes.items()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sizes}
    for round_ in range(args.rounds):
        for name in (["small", "large"] if round_ % 2 == 0 else ["large", "small"]):
            with contextlib.ExitStack() as stack:
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-large-")))
                run_env = {**env, "ATTENTION_DATA_DIR": str(workdir / "data")}
                if args.redis:
                    run_env["ATTENTION_QUEUE_URL"] = stack.enter_context(RedisServer()).url
                server = stack.enter_context(Gunicorn(run_env, workers=1))
                workers = stack.enter_context(Workers(2, run_env, workdir))
                session = stack.enter_context(requests.Session())
                job = through_jobs(session, server.url, contents[name], "/v1/attention")
                peaks = {"api": max(memory_kib(pid, "VmHWM") for pid in server.workers()),
                         "worker": max(memory_kib(pid, "VmHWM") for pid in workers.pids())}
            lines = job.pop("output").splitlines()
            assert len(lines) == len({orjson.loads(line)["custom_id"] for line in lines}) == sizes[name]
            assert all(b'"status_code":200' in line for line in lines)
            runs[name].append({"rate": sizes[name] / job["seconds"], **peaks})
            print(f"round {round_ + 1} {name}: {sizes[name]} items in {job['seconds']:.1f} s "
                  f"({sizes[name] / job['seconds']:.0f} items/s; upload+create {job['submit']:.1f} s), peak RSS "
                  f"web worker {peaks['api'] / 1024:.0f} MiB, job workers {peaks['worker'] / 1024:.0f} MiB at most")
    for key, what, target in (("rate", "items/s", ">= 0.8x"), ("api", "peak RSS of the web worker", "<= 1.3x"),
                              ("worker", "peak RSS of the job workers (the larger)", "<= 1.3x")):
        ratios = [big[key] / few[key] for big, few in zip(runs["large"], runs["small"], strict=True)]
        median = statistics.median(ratios)
        met = median >= 0.8 if key == "rate" else median <= 1.3
        print(f"{what}: {sizes['large']} items / {sizes['small']} {median:.2f}x (per round "
              f"{', '.join(f'{r:.2f}' for r in ratios)}; {interval(ratios)}); target {target}: "
              f"{'PASS' if met else 'MISS'}")


def through_template(session: requests.Session, url: str) -> str:
    """A real batch of 3 demo-5 items run to its end through the API and a worker: its id."""
    batch_id = submit(session, url, ndjson(demo5_items(3)))["id"]
    assert until(session, url, batch_id, ENDED, POLL)["status"] == "completed"
    return batch_id


def timed(call: Any, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``call``."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    """Start the servers, measure every round, print the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10_000, help="items per measurement (default 10000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three measurements (default 3)")
    parser.add_argument("--redis", action="store_true", help="the queue on a redis-server started here")
    parser.add_argument("--census", type=int, default=200, help="batches in the store when /metrics is timed")
    parser.add_argument("--history", action="store_true", help="what finished batches cost a reap, a list and a "
                        "submit (--few against --many of them; --rounds, default 3, better 6 for an interval)")
    parser.add_argument("--large", action="store_true", help="--large-items small items against --items of them: "
                        "items/s and the peak RSS of each process (fresh processes per measurement)")
    parser.add_argument("--large-items", type=int, default=LARGE_ITEMS, help="items of the large batch (--large)")
    parser.add_argument("--few", type=int, default=10, help="finished batches of the small store (--history)")
    parser.add_argument("--many", type=int, default=10_000, help="finished batches of the large store (--history)")
    args = parser.parse_args()
    if args.history:
        history(args)
        return
    if args.large:
        large(args)
        return
    bodies = demo5_items(args.items)
    content = ndjson(bodies)
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-jobs-")))
        env = {**os.environ, "ATTENTION_DATA_DIR": str(workdir / "data"), "ATTENTION_EMBEDDED_WORKERS": "0",
               "GUNICORN_MAX_REQUESTS": "1000000"}
        env.pop("ATTENTION_QUEUE_URL", None)
        if args.redis:
            env["ATTENTION_QUEUE_URL"] = stack.enter_context(RedisServer()).url
        server = stack.enter_context(Gunicorn(env, workers=1))
        session = stack.enter_context(requests.Session())
        print(f"gunicorn at {server.url}, 1 sync web worker; queue {'Redis' if args.redis else 'SQLite'}; "
              f"{args.items} demo-5 items; {args.rounds} rounds; {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f} at the start")
        empty = scrape(session, server.url)[0]
        expected = batch_answers(through_batch(session, server.url, bodies))  # also the web worker's warm-up
        runs: dict[str, list[dict[str, Any]]] = {"batch": [], "1 worker": [], "2 workers": []}
        names = list(runs)
        machine = []
        for round_ in range(args.rounds):
            machine.append(machine_scaling())
            for name in names[round_ % 3:] + names[:round_ % 3]:
                runs[name].append(measure(session, server, name, env, workdir, bodies, content, expected))
        with Workers(1, env, workdir):
            latencies = to_in_progress(session, server.url, 7)
            fill(session, server.url, args.census)
            full, census = scrape(session, server.url)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    report(args.items, runs, machine, latencies, {"an empty store": empty, f"{args.census} batches": full}, census)


def measure(session: requests.Session, server: Gunicorn, name: str, env: dict[str, str], workdir: Path,
            bodies: list[dict[str, Any]], content: bytes, expected: list[Any]) -> dict[str, Any]:
    """One measurement of ``name`` ("batch", "1 worker" or "2 workers"): its seconds; the [CPU, waiting for a
    CPU] seconds (:func:`usage`) of the web worker ("api"), of this client and of the job workers; the jobs'
    phases. Its answers are checked once the clock has stopped."""
    client = [os.getpid()]
    if name == "batch":
        before = usage(server.workers()), usage(client)
        started = time.perf_counter()
        received = through_batch(session, server.url, bodies)
        seconds = time.perf_counter() - started
        measured = {"seconds": seconds, "api": usage(server.workers()) - before[0], "client": usage(client) - before[1]}
        assert batch_answers(received) == expected, "/v1/batch's answers changed"
        return measured
    with Workers(int(name[0]), env, workdir) as workers:
        warm_up = through_jobs(session, server.url, ndjson(bodies[:2 * BATCH_ITEMS]))  # imports, first allocations
        check(warm_up, expected[:2 * BATCH_ITEMS])
        workers.mark()
        before = usage(server.workers()), usage(client), usage(workers.pids())
        job = through_jobs(session, server.url, content)
        job.update(api=usage(server.workers()) - before[0], client=usage(client) - before[1],
                   workers=usage(workers.pids()) - before[2], chunk=statistics.median(workers.task_seconds("chunk")),
                   validate=max(workers.task_seconds("validate")), finalize=max(workers.task_seconds("finalize")))
    check(job, expected)
    return job


def report(items: int, runs: dict[str, list[dict[str, Any]]], machine: list[float], latencies: list[float],
           scrapes: dict[str, list[float]], census: str) -> None:
    """Print the medians, the paired ratios and the targets' PASS/MISS lines."""
    rate = {name: [items / run["seconds"] for run in measured] for name, measured in runs.items()}
    for name, measured in runs.items():
        rounds = ", ".join(f"{r:.0f}" for r in rate[name])
        median = {key: np.median([run[key] for run in measured], axis=0) for key in measured[0]}
        per = {key: f"{median[key][0] / items * 1e6:.0f} ms (waiting for a CPU {median[key][1] / median['seconds']:.0%}"
                    " of the time)" for key in ("api", "client", "workers") if key in median}
        line = (f"{name:9} {statistics.median(rate[name]):6.0f} items/s (rounds {rounds}); CPU per 1000 items: "
                f"{', '.join(f'{key} {figure}' for key, figure in per.items())}")
        if name != "batch":
            line += (f"\n{'':10}upload+create {median['submit'] * 1e3:.0f} ms, until ended {median['wait'] * 1e3:.0f}"
                     f" ms (polled every {POLL * 1e3:.0f} ms; in it validate {median['validate'] * 1e3:.0f} ms, "
                     f"finalize {median['finalize'] * 1e3:.0f} ms, a chunk {median['chunk'] * 1e3:.0f} ms), output "
                     f"download {median['download'] * 1e3:.0f} ms")
        print(line)
    one = [w / b for w, b in zip(rate["1 worker"], rate["batch"], strict=True)]
    two = [w2 / w1 for w2, w1 in zip(rate["2 workers"], rate["1 worker"], strict=True)]
    relative = [ratio / most for ratio, most in zip(two, machine, strict=True)]
    for what, ratios in (("1 worker / batch", one), ("2 workers / 1 worker", two),
                         ("two CPU-bound processes / one, on this machine (each round's start)", machine),
                         ("2 workers / 1 worker, as a share of that", relative)):
        print(f"{what}: {statistics.median(ratios):.2f}x (paired per round {', '.join(f'{r:.2f}' for r in ratios)};"
              f" {interval(ratios)})")
    cpu = {name: statistics.median(run[key][0] for run in runs[name]) for name, key in (
        ("batch", "api"), ("1 worker", "workers"), ("2 workers", "workers"))}
    print(f"CPU per item: one job worker {cpu['1 worker'] / cpu['batch']:.2f}x /v1/batch's web worker, two job workers"
          f" {cpu['2 workers'] / cpu['1 worker']:.2f}x one (1.00: running side by side costs nothing more)")
    single = {key: statistics.median(run[key] for run in runs["1 worker"])
              for key in ("seconds", "submit", "validate", "finalize", "download")}
    serial = sum(single.values()) - single["seconds"]
    print(f"two workers at best (Amdahl, from the 1-worker runs' serial phases: upload, validate, finalize, download "
          f"{serial * 1e3:.0f} ms of {single['seconds'] * 1e3:.0f}): "
          f"{single['seconds'] / (serial + (single['seconds'] - serial) / 2):.2f}x one")
    shared = {key: statistics.median(run[key][0] for run in runs["2 workers"]) for key in ("workers", "api", "client")}
    cores = os.cpu_count() or 1
    print(f"two workers at best by CPU: {min(2.0, cores * shared['workers'] / sum(shared.values())):.2f} of the "
          f"{cores} cores (the 2-worker runs' CPU per 1000 items: workers {shared['workers'] / items * 1e6:.0f} ms, "
          f"API {shared['api'] / items * 1e6:.0f} ms, client {shared['client'] / items * 1e6:.0f} ms)")
    print(f"submit -> in_progress: median {statistics.median(latencies) * 1e3:.0f} ms, max "
          f"{max(latencies) * 1e3:.0f} ms ({len(latencies)} batches of 5 items, an idle worker, polled every 10 ms)")
    for what, times in scrapes.items():
        print(f"GET /metrics with {what}: median {statistics.median(times) * 1e3:.1f} ms, max "
              f"{max(times) * 1e3:.1f} ms ({len(times)} scrapes)")
    print(census)
    scrape_ms = statistics.median(list(scrapes.values())[-1]) * 1e3
    for target, met, figure in (("1 worker >= 0.8x /v1/batch", statistics.median(one) >= 0.8,
                                 f"{statistics.median(one):.2f}x"),
                                ("2 workers >= 1.7x 1 worker", statistics.median(two) >= 1.7,
                                 f"{statistics.median(two):.2f}x"),
                                ("GET /metrics with the census < 50 ms", scrape_ms < 50, f"{scrape_ms:.1f} ms")):
        print(f"target {target}: {'PASS' if met else 'MISS'} ({figure})")


if __name__ == "__main__":
    main()
