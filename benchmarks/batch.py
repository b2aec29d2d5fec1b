"""Benchmark of POST /v1/batch against the same items sent one by one (issue 4, "Speed").

Run:  .venv/bin/python benchmarks/batch.py               (about a minute)
      .venv/bin/python benchmarks/batch.py --repeats 3
      .venv/bin/python benchmarks/batch.py --before ../old --repeats 12
          (a change's guard: ../old, a checkout of the code before it with its own venv, served beside it and
          timed in the same rounds)

It starts the real gunicorn (service/gunicorn.conf.py, one sync worker, a free loopback port; stopped at
the end) and measures, in the same run, from one client (a requests.Session: the sync worker closes
every connection anyway, so each single request pays a TCP handshake, as real clients do):
  demo-5    64 single POST /v1/multi-head-attention of the seed's demo 5 (5 tokens, d_model 8, 4 heads,
            causal, positional encoding) vs the same 64 items in one POST /v1/batch. Target: >= 15x items/s.
  n128      256 items of (n=128 tokens, d_model=64, h=4), return_weights false, singles vs one batch.
Medians over ``--repeats`` rounds, singles and batch alternating (the machine is shared and noisy, so
drift hits both alike); before timing, every batch answer is checked equal to its single answer. Peak
worker memory is the worker's VmHWM (/proc) at the end, and its RSS after start-up for scale. This is a
benchmark, not a test: nothing asserts timings.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import requests

if __package__ in (None, ""):  # run as a script: make the repo root importable (service/)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from benchmarks.http_load import bracketed
from tests.harness import ROOT, Gunicorn

TIMEOUT = 120  # seconds per HTTP call: bounded even if the server misbehaves
JSON = {"Content-Type": "application/json"}
WORDS = ["the", "cat", "ate", "food", "it"]


def demo5_items(count: int) -> list[dict[str, Any]]:
    """The seed's demo 5 with the sentence rotated per item (same shapes, different numbers)."""
    return [{"tokens": WORDS[i % 5:] + WORDS[:i % 5], "d_model": 8, "n_heads": 4, "positional_encoding": True,
             "causal": True} for i in range(count)]


def large_items(count: int, n: int = 128) -> list[dict[str, Any]]:
    """(n, d_model=64, h=4) items from random sentences of the toy vocabulary, no weights returned."""
    rng = np.random.default_rng(0)
    return [{"tokens": rng.choice(WORDS, n).tolist(), "d_model": 64, "n_heads": 4, "positional_encoding": True,
             "return_weights": False} for _ in range(count)]


def post(session: requests.Session, url: str, body: Any) -> Any:
    """POST JSON and parse the answer with orjson, as a speed-minded client would, for singles and batch alike
    (the stdlib's json.loads of a 64-item answer costs about as much as the server's whole batch)."""
    response = session.post(url, data=orjson.dumps(body), headers=JSON, timeout=TIMEOUT)
    response.raise_for_status()
    return orjson.loads(response.content)


def singles(session: requests.Session, url: str, bodies: list[dict[str, Any]]) -> list[Any]:
    return [post(session, f"{url}/v1/multi-head-attention", body) for body in bodies]


def batch(session: requests.Session, url: str, bodies: list[dict[str, Any]]) -> list[Any]:
    requests_ = [{"id": str(i), "op": "multi-head-attention", "body": body} for i, body in enumerate(bodies)]
    answers = post(session, f"{url}/v1/batch", {"requests": requests_})["responses"]
    assert all(answer["status"] == 200 for answer in answers), answers[:2]
    return [answer["body"] for answer in answers]


def timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def compare(name: str, servers: dict[str, Gunicorn], bodies: list[dict[str, Any]], repeats: int) -> float:
    """Check batch == singles, then time both on each server, alternating round by round (so drift on this shared
    machine hits all alike); print medians, items/s and the ratio per server (and, with a before, after/before of
    the paired rounds' ratios); return this code's ratio."""
    rounds: dict[str, list[tuple[float, float]]] = {label: [] for label in servers}
    with requests.Session() as session:
        for label, server in servers.items():
            answers = batch(session, server.url, bodies)
            assert answers == singles(session, server.url, bodies), f"{name} ({label}): answers differ"
        for _ in range(repeats):
            for label, server in servers.items():
                rounds[label].append((timed(lambda url=server.url: singles(session, url, bodies)),
                                      timed(lambda url=server.url: batch(session, url, bodies))))
    count, ratios = len(bodies), {}
    for label, timings in rounds.items():
        single_s, batch_s = (statistics.median(times) for times in zip(*timings, strict=True))
        ratios[label] = [single / together for single, together in timings]
        print(f"{name:8} {label:6} {count:4} items   singles {single_s * 1e3:8.1f} ms ({count / single_s:8.0f} "
              f"items/s)   batch {batch_s * 1e3:8.1f} ms ({count / batch_s:8.0f} items/s)   batch/singles "
              f"{statistics.median(ratios[label]):5.1f}x {bracketed(ratios[label], '.1f')}")
    if "before" in ratios:
        change = [now / then for now, then in zip(ratios["after"], ratios["before"], strict=True)]
        print(f"{name:8} after/before of batch/singles, per round: {statistics.median(change):.3f}x "
              f"{bracketed(change, '.3f')}")
    return statistics.median(ratios["after"])



def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds per case (medians reported)")
    parser.add_argument("--before", type=Path, help="a checkout of the code before a change, with its venv")
    args = parser.parse_args()
    roots = {"after": ROOT, **({"before": args.before} if args.before else {})}
    with contextlib.ExitStack() as stack:
        servers = {label: stack.enter_context(Gunicorn({"GUNICORN_MAX_REQUESTS": "1000000"}, workers=1, root=root))
                   for label, root in roots.items()}
        [worker] = servers["after"].workers()
        started = memory_kib(worker)
        print(f"gunicorn at {servers['after'].url}, 1 sync worker (pid {worker}), {args.repeats} repetitions, medians")
        ratio = compare("demo-5", servers, demo5_items(64), args.repeats)
        compare("n128", servers, large_items(256), max(1, args.repeats // 2))
        peak = memory_kib(worker)
    print(f"worker memory: RSS after start-up {started['VmRSS'] / 1024:.0f} MiB, "
          f"peak (VmHWM) {peak['VmHWM'] / 1024:.0f} MiB")
    print(f"target demo-5 batch >= 15x singles: {'PASS' if ratio >= 15 else 'MISS'} ({ratio:.1f}x)")


if __name__ == "__main__":
    main()
