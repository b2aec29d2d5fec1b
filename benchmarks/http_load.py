"""HTTP throughput and latency of the real server against a bare Flask endpoint, same gunicorn settings.

Run:  .venv/bin/python benchmarks/http_load.py                 (about 30 s; needs wrk: apt-get install -y wrk)
      .venv/bin/python benchmarks/http_load.py --seconds 5 --clients 1 8 32

Both servers run service/gunicorn.conf.py (sync workers, one per core, max_requests with jitter) on
a free loopback port: the real one serves service.wsgi:app, the baseline benchmarks/bare_app.py (parses
the same body with orjson, returns a fixed JSON of the answer's shape). wrk (C, one thread, its Lua
script benchmarks/http_body.lua) sends demo-5 sized multi-head attention with fresh random embeddings
in every request (5x8, 4 heads, causal) for ``--seconds`` at each number of concurrent clients, after
a short warm-up. Printed per level: requests/s, p50/p99 latency, errors for both, and the ratios.
The load generator's own CPU use is printed too, to show it is not the bottleneck. Targets (issue 7):
real >= 65% of the bare throughput, 0 errors, p99 < 20 ms at 8 clients. A benchmark: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable (service/)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from service.launch import gunicorn

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "http_body.lua"
PATH = "/v1/multi-head-attention"


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


def measure(app: str, levels: list[int], seconds: int) -> dict[int, dict]:
    with gunicorn(app=app) as server:
        wrk(server.url, 4, 1)  # warm-up: imports, first allocations, example caches
        return {clients: wrk(server.url, clients, seconds) for clients in levels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=4, help="per level and server (default 4)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed: apt-get install -y wrk")
    bare = measure("benchmarks.bare_app:app", args.clients, args.seconds)
    real = measure("service.wsgi:app", args.clients, args.seconds)
    print(f"POST {PATH}, demo-5 size (5x8 random embeddings, 4 heads, causal); {args.seconds:g} s per level;"
          " wrk -t1, every request a new TCP connection (sync workers close them)")
    print(f"{'clients':>7} | {'server':<5} | {'req/s':>7} | {'p50 ms':>6} | {'p99 ms':>6} | {'max ms':>6} | "
          f"{'errors':>6} | {'wrk CPU':>7}")
    for clients in args.clients:
        for name, runs in (("bare", bare), ("real", real)):
            r = runs[clients]
            print(f"{clients:>7} | {name:<5} | {r['rps']:>7.0f} | {r['p50_us'] / 1e3:>6.2f} | {r['p99_us'] / 1e3:>6.2f}"
                  f" | {r['max_us'] / 1e3:>6.1f} | {r['errors']:>6} | {r['wrk_cpu']:>6.0%}")
        ratio = real[clients]["rps"] / bare[clients]["rps"]
        p99 = real[clients]["p99_us"] / bare[clients]["p99_us"]
        print(f"{clients:>7} | ratio real/bare: throughput {ratio:.0%} (target >= 65%), p99 x{p99:.2f}")


if __name__ == "__main__":
    main()
