"""HTTP throughput and latency of the real server against a bare Flask endpoint, same gunicorn settings.

Run:  .venv/bin/python benchmarks/http_load.py                 (about 45 s; needs wrk: apt-get install -y wrk)
      .venv/bin/python benchmarks/http_load.py --seconds 3 --rounds 5 --clients 1 8 32
      .venv/bin/python benchmarks/http_load.py --before ../old --rounds 12 --clients 1 8
          (a change's guard: ../old is a checkout of the code before it, e.g. `git worktree add ../old <commit>`,
          with its own venv, `make setup-test`; its real app runs in the same rounds)

Both servers run service/gunicorn.conf.py (sync workers, one per core, max_requests with jitter) on
a free loopback port: the real one serves service.wsgi:app, the baseline benchmarks/bare_app.py (parses
the same body with orjson, returns a fixed JSON of the answer's shape). wrk (C, one thread, its Lua
script benchmarks/http_body.lua) sends demo-5 sized multi-head attention with fresh random embeddings
in every request (5x8, 4 heads, causal) at each number of concurrent clients, after a short warm-up:
``--rounds`` runs of ``--seconds`` per server, alternating bare and real (who goes first swaps each
round). Printed per level: medians of requests/s and p50/p99 latency, errors for both, and the median
of the paired ratios (each round's) with, from 6 rounds on, a 95% interval for it (more, narrower).
The load generator's own CPU use is printed too, to show it is not the bottleneck. Targets (issue 7):
real >= 65% of the bare throughput, 0 errors, p99 < 20 ms at 8 clients. A benchmark: nothing asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable (service/)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from tests.harness import Gunicorn

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "http_body.lua"
PATH = "/v1/multi-head-attention"
APPS = {"bare": "benchmarks.bare_app:app", "real": "service.wsgi:app"}


def wrk(url: str, clients: int, seconds: int) -> dict:
    """One wrk run: its summary plus the CPU seconds wrk itself used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--timeout", "5s", "-s", str(SCRIPT),
                             url + PATH], capture_output=True, text=True, timeout=seconds + 30, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    [line] = [line for line in result.stdout.splitlines() if line.startswith("SUMMARY ")]
    summary = json.loads(line.removeprefix("SUMMARY "))
    summary["rps"] = summary["requests"] / summary["seconds"]
    summary["wrk_cpu"] = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / summary["seconds"]
    return summary


def measure(levels: list[int], seconds: float, rounds: int, before: Path | None) -> dict[str, dict[int, list[dict]]]:
    """Both servers up at once; per level, ``rounds`` runs of each, alternating bare and real, so a noisy
    minute of this shared machine lands on both sides (measured in two phases, one noisy phase moved the
    ratio by 10 points), and which goes first swaps every round (with a fixed order, the second server of
    each round measured 3-6% slower at 1 client). An idle sync worker sleeps in select(): the other server
    costs nothing meanwhile."""
    servers = {name: {"app": app} for name, app in APPS.items()}
    if before is not None:
        servers["before"] = {"app": APPS["real"], "root": before}
    runs: dict[str, dict[int, list[dict]]] = {name: {level: [] for level in levels} for name in servers}
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(Gunicorn(**options)).url for name, options in servers.items()}
        for url in urls.values():
            wrk(url, 4, 1)  # warm-up: imports, first allocations, example caches
        names = list(servers)
        for level in levels:
            for round_ in range(rounds):
                shift = round_ % len(names)  # who goes first turns every round
                for name in names[shift:] + names[:shift]:
                    runs[name][level].append(wrk(urls[name], level, seconds))
    return runs


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of ``values`` (the sign test's): the order statistics
    r and n+1-r, r the largest with P(Binomial(n, 1/2) <= r-1) <= (1-level)/2. None below 6 values.

    At 1 client one round's ratio can land anywhere in 50-85% on this shared machine, so one run's median
    moves by a few points; the interval says by how much, and whether a target is met beyond that.
    """
    xs, n = sorted(values), len(values)
    below, r = 0.0, 0                       # below = P(B <= r - 1)
    while below + (p := math.comb(n, r) / 2**n) <= (1 - level) / 2:
        below += p
        r += 1
    return (xs[r - 1], xs[n - r]) if r >= 1 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=2, help="per run (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per level and server, alternating (default 3)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--before", type=Path, help="a checkout of the code before a change, with its venv")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed: apt-get install -y wrk")
    runs = measure(args.clients, args.seconds, args.rounds, args.before)
    print(f"POST {PATH}, demo-5 size (5x8 random embeddings, 4 heads, causal); medians of {args.rounds} runs of "
          f"{args.seconds:g} s per level and server, alternating; wrk -t1, every request a new TCP connection "
          "(sync workers close them)")
    print(f"{'clients':>7} | {'server':<5} | {'req/s':>7} | {'p50 ms':>6} | {'p99 ms':>6} | {'max ms':>6} | "
          f"{'errors':>6} | {'wrk CPU':>7}")
    for clients in args.clients:
        for name in runs:
            r = runs[name][clients]
            print(f"{clients:>7} | {name:<5} | {median_of(r, 'rps'):>7.0f} | {median_of(r, 'p50_us') / 1e3:>6.2f} | "
                  f"{median_of(r, 'p99_us') / 1e3:>6.2f} | {max(run['max_us'] for run in r) / 1e3:>6.1f} | "
                  f"{sum(run['errors'] for run in r):>6} | {median_of(r, 'wrk_cpu'):>6.0%}")
        bare, real = runs["bare"][clients], runs["real"][clients]
        paired = [r["rps"] / b["rps"] for b, r in zip(bare, real, strict=True)]
        ratios = ", ".join(f"{ratio:.0%}" for ratio in paired)
        p99 = median_of(real, "p99_us") / median_of(bare, "p99_us")
        interval = median_interval(paired)
        spread = f"95% interval {interval[0]:.0%}-{interval[1]:.0%}" if interval else "too few rounds for an interval"
        print(f"{clients:>7} | ratio real/bare: throughput {statistics.median(paired):.0%} ({spread} of the median; "
              f"target >= 65%; per round {ratios}), p99 x{p99:.2f}")
        if "before" in runs:
            earlier = [old["rps"] / b["rps"] for b, old in zip(bare, runs["before"][clients], strict=True)]
            change = [now / then for now, then in zip(paired, earlier, strict=True)]
            print(f"{clients:>7} | before/bare {statistics.median(earlier):.1%} {bracketed(earlier, '.1%')}; "
                  f"after/bare {statistics.median(paired):.1%} {bracketed(paired, '.1%')}; after/before per round "
                  f"{statistics.median(change):.3f}x {bracketed(change, '.3f')}")


def bracketed(values: list[float], form: str) -> str:
    """The 95% interval of the median of ``values`` in brackets, each end in ``form`` (``".1%"``)."""
    interval = median_interval(values)
    return f"[{interval[0]:{form}}, {interval[1]:{form}}]" if interval else "[too few rounds]"


if __name__ == "__main__":
    main()
