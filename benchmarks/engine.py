"""Benchmark of the numpy attention engine against a seed-style loop and PyTorch (issue 2, point 9).

Run:  .venv/bin/python benchmarks/engine.py            (all shapes, float64 and float32; a few minutes)
      .venv/bin/python benchmarks/engine.py --quick    (small shapes only)
      .venv/bin/python benchmarks/engine.py --shapes 4,1024,512,8 --dtype float32

For every shape (B, n, d_model, h) and dtype it times, on the same weights and inputs:
  seed    a seed-style loop: per batch item and per head X @ W_q/W_k/W_v, 2-D scaled dot-product attention,
          concatenate, @ W_o (the seed script's code path, looped over batch items since the seed is 2-D);
  eng+w   attention.MultiHeadAttention(d_model, h, seed=0)(X, return_weights=True);
  eng     the same with return_weights=False;
  mha     torch.nn.MultiheadAttention(bias=False, batch_first=True).eval() under torch.inference_mode(),
          need_weights=True, average_attn_weights=False (only when torch is importable);
  sdpa    torch matmuls + torch.nn.functional.scaled_dot_product_attention, output only;
  floor   at (4,1024,512,8) only: the output-only maths as bare numpy calls (no checks, no Python layers),
          what numpy's calls in sequence cost at least here; printed with the targets (floor_forward).
Before timing, every method's output (and weights, where it returns them) is checked against the engine's.

It also measures a large np.matmul in the same run for GFLOP/s, the peak extra memory of the engine call
(tracemalloc sees numpy's allocations), and prints PASS/MISS against the targets of issue 2 at (4,1024,512,8).

Benchmark hygiene: torch gets as many threads as numpy's BLAS; if OPENBLAS_CORETYPE is set (it is on some
machines here, for old OpenBLAS builds) numpy may run a slower kernel: unset it together with
OPENBLAS_L2_SIZE in the benchmark's command alone (`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python ...`).
This is a benchmark, not a test: nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable (attention/)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import attention
from attention.kernel import TILE_BYTES

try:
    import torch
    import torch.nn.functional as F
    TORCH_ERROR = ""
except ImportError as exc:  # torch is an optional benchmark extra
    torch = None
    F = None
    TORCH_ERROR = str(exc)

try:
    import threadpoolctl
except ImportError:
    threadpoolctl = None

Shape = tuple[int, int, int, int]
ALL_SHAPES: list[Shape] = [
    (1, 5, 8, 4), (1, 128, 64, 4), (8, 128, 256, 8), (1, 512, 512, 8), (4, 1024, 512, 8),
]
QUICK_SHAPES: list[Shape] = ALL_SHAPES[:3]
TARGET_SHAPE: Shape = (4, 1024, 512, 8)
NUMPY_METHODS = ("seed", "eng+w", "eng")
FLOOR_METHOD = "floor"  # timed with the numpy methods, at TARGET_SHAPE only (printed with the targets)
TORCH_METHODS = ("mha", "sdpa")
TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}  # max |diff| / max |reference|
MATMUL_N = 2048
NOISY_CORES = 0.15  # a row during which other processes kept more cores busy is flagged/re-measured
SETTLE_S = 0.5  # seconds of warm-up before each group of timed methods


# ----------------------------------------------------------------------------------------------- timing
@dataclass
class Timing:
    """Median seconds per call of one method, and how many timed rounds it took."""

    median: float
    rounds: int

    @property
    def ms(self) -> float:
        """Median in milliseconds."""
        return self.median * 1e3


@dataclass
class Plan:
    """How one method is timed: calls per round (fast calls are grouped) and number of rounds."""

    fn: Callable[[], Any]
    inner: int
    rounds: int
    samples: list[float] = field(default_factory=list)


def calibrate(fn: Callable[[], Any], budget: float, min_rounds: int = 6, max_rounds: int = 200) -> Plan:
    """Pick an adaptive repeat count for an already warmed-up fn that fits ~budget seconds.

    Fast calls are grouped (inner calls per round, each round >= ~2 ms) so the timer's resolution doesn't
    matter; a call so slow that min_rounds would take over 3x the budget is timed fewer times (at least once).
    """
    single = _time_calls(fn, 1)
    inner = max(1, int(2e-3 / max(single, 1e-9)))
    per_round = single * inner
    floor = min_rounds if per_round * min_rounds <= 3 * budget else 1
    return Plan(fn, inner, min(max_rounds, max(int(budget / per_round), floor)))


def settle(fns: Sequence[Callable[[], Any]], seconds: float = SETTLE_S) -> None:
    """Warm up: call each fn at least once, and keep calling for `seconds` of wall time.

    Idle OpenBLAS workers spin for ~0.1-0.4 s after a numpy call and torch's OpenMP workers after a torch
    call; on 2 cores that stalls the other library's threads (a 0.1 ms torch call then takes ~20 ms). So
    numpy and torch methods are timed in separate groups, each group after its own settling time.
    """
    gc.collect()
    end = time.perf_counter() + seconds
    while True:
        for fn in fns:
            fn()
        if time.perf_counter() >= end:
            return


def measure_groups(groups: Sequence[dict[str, Callable[[], Any]]], budgets: dict[str, float],
                   passes: int = 2) -> dict[str, Timing]:
    """Time methods round-robin within a group, group after group, in `passes` passes.

    Round-robin spreads background load evenly over a group's methods; the passes spread slow drift
    over the groups.
    """
    plans: dict[str, Plan] = {}
    for group in groups:
        settle(list(group.values()))
        plans.update({name: calibrate(fn, budgets[name]) for name, fn in group.items()})
    for p in range(passes):
        for group in groups:
            settle(list(group.values()))
            todo = {name: plans[name] for name in group}
            for i in range(max(pl.rounds for pl in todo.values())):
                for pl in todo.values():
                    if i % passes == p and i < pl.rounds:
                        pl.samples.append(_time_calls(pl.fn, pl.inner))
    return {name: Timing(statistics.median(pl.samples), pl.rounds) for name, pl in plans.items()}


def measure(fn: Callable[[], Any], budget: float) -> Timing:
    """Median seconds per call of one function."""
    return measure_groups([{"fn": fn}], {"fn": budget}, passes=1)["fn"]


def _time_calls(fn: Callable[[], Any], inner: int) -> float:
    """Seconds per call, averaged over `inner` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


# ---------------------------------------------------------------------------------------- environment
def blas_info() -> dict[str, Any]:
    """numpy's BLAS as threadpoolctl sees it (library, threads, kernel/core type)."""
    if threadpoolctl is None:
        return {"internal_api": "?", "num_threads": os.cpu_count() or 1, "architecture": "?"}
    for info in threadpoolctl.threadpool_info():
        if info.get("user_api") == "blas" and "numpy" in info.get("filepath", ""):
            return info
    blas = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return blas[0] if blas else {"internal_api": "none", "num_threads": 1, "architecture": "?"}


def setup_torch(threads: int) -> None:
    """Give torch the same number of intra-op threads as numpy's BLAS."""
    if torch is not None:
        torch.set_num_threads(threads)


class OtherLoad:
    """CPU time other processes used while this one ran (Linux /proc/stat), in cores on average.

    On a 2-core machine a second busy process stalls every 2-thread BLAS/OpenMP call, so rows measured
    while others used a sizeable fraction of a core are not comparable: the table marks them.
    """

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float]:
        """(wall s, busy CPU s of the whole machine, CPU s of this process)."""
        own = sum(os.times()[:2])
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return time.perf_counter(), own, own
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return time.perf_counter(), (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK"), own

    def cores(self) -> float:
        """Average number of cores other processes kept busy since construction."""
        wall0, busy0, own0 = self.start
        wall1, busy1, own1 = self._read()
        return max(0.0, ((busy1 - busy0) - (own1 - own0)) / max(wall1 - wall0, 1e-9))


def load_average() -> str:
    """The 1/5/15-minute load averages: other work on this 2-core machine skews every number here."""
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def print_environment(blas: dict[str, Any]) -> None:
    """Print versions, thread counts and the BLAS core type."""
    print(f"python {platform.python_version()}  numpy {np.__version__}  cpus {os.cpu_count()}  "
          f"machine {platform.machine()}  {load_average()} (other work skews the timings)")
    print(f"numpy BLAS: {blas.get('internal_api')} {blas.get('version', '')}  "
          f"threads {blas.get('num_threads')}  core type {blas.get('architecture')}")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if var in os.environ:
            print(f"  env {var}={os.environ[var]}")
    if "OPENBLAS_CORETYPE" in os.environ:
        print("  NOTE: OPENBLAS_CORETYPE is set: numpy may run a slower kernel than this CPU allows. "
              "For a fair benchmark run with `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`.")
    if torch is None:
        print(f"torch: not importable ({TORCH_ERROR}; pip install torch==2.13.0): mha and sdpa skipped")
    else:
        print(f"torch {torch.__version__}  intra-op threads {torch.get_num_threads()}  "
              f"mkl {torch.backends.mkl.is_available()}")


# --------------------------------------------------------------------------------------------- inputs
def make_inputs(shape: Shape, dtype: type) -> np.ndarray:
    """X of shape (B, n, d_model), scaled so that with the seed's N(0, 0.5) weights q, k have unit variance.

    Unit-variance q and k keep the scaled scores ~N(0, 1): softmax does not saturate, which makes the float32
    agreement check meaningful (and is the regime a layer-normed model runs in).
    """
    b, n, d, _ = shape
    rng = np.random.default_rng(1234)
    return (rng.standard_normal((b, n, d)) * (2.0 / math.sqrt(d))).astype(dtype)


def flops(shape: Shape) -> float:
    """FLOPs of one multi-head forward: 4 projections + QK^T and weights @ V."""
    b, n, d, h = shape
    return 4 * 2 * b * n * d * d + 2 * 2 * b * h * n * n * (d // h)


# ------------------------------------------------------------------------------------- seed-style loop
def seed_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The seed's softmax."""
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def seed_sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The seed's 2-D scaled dot-product attention (scale as a Python float, so float32 stays float32)."""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    weights = seed_softmax(scores, axis=-1)
    return weights @ v, weights


@dataclass
class SeedWeights:
    """Per-head 2-D weight matrices, as the seed's SelfAttention heads hold them, in one dtype."""

    w_q: list[np.ndarray]
    w_k: list[np.ndarray]
    w_v: list[np.ndarray]
    w_o: np.ndarray


def seed_weights(mha: Any, dtype: type) -> SeedWeights:
    """Split the engine's stacked (h, d_model, d_k) weights into per-head matrices of `dtype`."""
    def heads(w: np.ndarray) -> list[np.ndarray]:
        return [np.ascontiguousarray(w[i], dtype=dtype) for i in range(w.shape[0])]
    return SeedWeights(heads(mha.w_q), heads(mha.w_k), heads(mha.w_v), np.asarray(mha.w_o, dtype=dtype))


def seed_forward(x: np.ndarray, sw: SeedWeights) -> tuple[np.ndarray, np.ndarray]:
    """Seed-style multi-head attention: Python loops over batch items and heads."""
    outs, weights = [], []
    for xb in x:
        head_outs, head_weights = [], []
        for wq, wk, wv in zip(sw.w_q, sw.w_k, sw.w_v, strict=True):
            o, w = seed_sdpa(xb @ wq, xb @ wk, xb @ wv)
            head_outs.append(o)
            head_weights.append(w)
        outs.append(np.concatenate(head_outs, axis=-1) @ sw.w_o)
        weights.append(head_weights)
    return np.stack(outs), np.asarray(weights)


# ---------------------------------------------------------------------------------------- numpy floor
def floor_forward(x: np.ndarray, w_qkv: np.ndarray, w_o: np.ndarray, n_heads: int) -> tuple[np.ndarray, None]:
    """The output-only maths as bare numpy calls and nothing else: no argument, mask or overflow checks,
    no Python layers, one reused score block of at most the engine's TILE_BYTES, normalised on the
    (rows, d_k) output rather than the (rows, n) block (one pass fewer than the weights need).

    What numpy's calls made one after another cost at least, on this machine, for the engine's no-weights
    call: its time against this one is the engine's own overhead; this one against torch's fused SDPA kernel
    is what numpy's primitives leave (each a separate pass over the scores; ufuncs on one core while BLAS
    uses all: only Python threads over score blocks, with BLAS on one thread, would use the idle core).
    """
    b, n, d = x.shape
    d_k = d // n_heads
    qkv = (x.reshape(-1, d) @ w_qkv).reshape(b, n, 3, n_heads, d_k)           # (B, n, 3, h, d_k)
    q, k, v = (np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)).reshape(-1, n, d_k)
               for i in range(3))                                               # each (B*h, n, d_k)
    q *= x.dtype.type(1 / math.sqrt(d_k))
    heads = np.empty_like(q)
    rows = max(1, min(n, TILE_BYTES // x.itemsize // n))
    step = max(1, TILE_BYTES // x.itemsize // (rows * n))
    block = np.empty((min(step, len(q)), rows, n), x.dtype)
    for g in range(0, len(q), step):                                           # heads of one block
        for r in range(0, n, rows):                                            # query rows of one block
            gs, rs = slice(g, g + step), slice(r, r + rows)
            scores = block[: min(step, len(q) - g), : min(rows, n - r)]        # (g, t, n)
            np.matmul(q[gs, rs], k[gs].swapaxes(1, 2), out=scores)
            scores -= np.maximum.reduce(scores, axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            total = np.add.reduce(scores, axis=-1, keepdims=True)              # (g, t, 1)
            np.matmul(scores, v[gs], out=heads[gs, rs])
            heads[gs, rs] /= total
    return heads.reshape(b, n_heads, n, d_k).transpose(0, 2, 1, 3).reshape(b, n, d) @ w_o, None


# ---------------------------------------------------------------------------------------------- torch
def fused_in_proj(mha: Any) -> np.ndarray:
    """(d_model, 3*d_model) matrix [W_q | W_k | W_v] with heads side by side: X @ it = [Q | K | V]."""
    d = mha.d_model
    blocks = [np.asarray(w).transpose(1, 0, 2).reshape(d, d) for w in (mha.w_q, mha.w_k, mha.w_v)]
    return np.concatenate(blocks, axis=1)


def torch_dtype(dtype: type) -> Any:
    """The torch dtype matching a numpy float dtype."""
    return torch.float32 if dtype == np.float32 else torch.float64


def to_torch(a: np.ndarray, dtype: type) -> Any:
    """A torch tensor holding a writable, contiguous copy of `a` (the engine's weights are read-only)."""
    return torch.from_numpy(np.array(a, dtype=dtype, order="C", copy=True))


def build_torch_mha(mha: Any, dtype: type) -> Any:
    """torch.nn.MultiheadAttention holding the engine's weights (torch's Linear computes x @ W.T)."""
    d, h = mha.d_model, mha.n_heads
    module = torch.nn.MultiheadAttention(d, h, bias=False, batch_first=True, dtype=torch_dtype(dtype))
    with torch.no_grad():
        module.in_proj_weight.copy_(to_torch(fused_in_proj(mha).T, np.float64))
        module.out_proj.weight.copy_(to_torch(np.asarray(mha.w_o).T, np.float64))
    return module.eval()


def torch_mha_forward(module: Any, x: Any) -> tuple[Any, Any]:
    """Self-attention through nn.MultiheadAttention, per-head weights (B, h, n, n)."""
    with torch.inference_mode():
        return module(x, x, x, need_weights=True, average_attn_weights=False)


def torch_sdpa_forward(x: Any, w_qkv: Any, w_o: Any, n_heads: int) -> Any:
    """Fused QKV matmul, reshape to (B, h, n, d_k), F.scaled_dot_product_attention, concat, out projection."""
    with torch.inference_mode():
        b, n, d = x.shape
        qkv = (x @ w_qkv).view(b, n, 3, n_heads, d // n_heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return o.transpose(1, 2).reshape(b, n, d) @ w_o


# --------------------------------------------------------------------------------------------- checks
def rel_err(got: Any, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (torch tensors accepted)."""
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-300))


def check_agreement(results: dict[str, tuple[Any, Any]], dtype: type) -> tuple[str, bool]:
    """Compare every method's output/weights with the engine's; return a printable line and ok flag."""
    ref_out, ref_w = (np.asarray(a, dtype=np.float64) for a in results["eng+w"])
    tol = TOLERANCE[dtype]
    parts, ok = [], True
    for name, (out, w) in results.items():
        if name == "eng+w":
            continue
        errs = [("out", rel_err(out, ref_out))] + ([("w", rel_err(w, ref_w))] if w is not None else [])
        ok &= all(e <= tol for _, e in errs)
        parts.append(f"{name} " + " ".join(f"{k}={e:.1e}" for k, e in errs))
    return f"check vs eng+w (tol {tol:g}): " + "; ".join(parts) + ("  OK" if ok else "  MISMATCH"), ok


# --------------------------------------------------------------------------------------------- memory
@dataclass
class Memory:
    """Peak bytes the engine allocated during one call (with weights), next to what it had to hold."""

    peak_extra: int
    inputs: int
    returned: int
    tile: int

    @property
    def budget(self) -> int:
        """Issue 2's bound: inputs + returned arrays + one score tile (here one n x n head block)."""
        return self.inputs + self.returned + self.tile

    @property
    def ratio(self) -> float:
        """(inputs + peak extra) / budget: ~1.0 or less meets the target."""
        return (self.inputs + self.peak_extra) / self.budget


def engine_memory(mha: Any, x: np.ndarray) -> Memory:
    """Peak extra memory of mha(x, return_weights=True) with tracemalloc (numpy reports its buffers to it)."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    out, w = mha(x, return_weights=True)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    n = x.shape[-2]
    weights_bytes = w.nbytes if w is not None else 0
    return Memory(peak, x.nbytes, out.nbytes + weights_bytes, n * n * x.itemsize)


# ----------------------------------------------------------------------------------------- one shape
@dataclass
class Row:
    """All measurements for one (shape, dtype)."""

    shape: Shape
    dtype: str
    times: dict[str, Timing] = field(default_factory=dict)
    check: str = ""
    memory: Memory | None = None
    others: float = 0.0

    def ms(self, method: str) -> float | None:
        """Median ms of a method, or None if it was not run."""
        t = self.times.get(method)
        return t.ms if t else None

    def gflops(self, method: str) -> float | None:
        """Achieved GFLOP/s of a method by the model FLOP count."""
        t = self.times.get(method)
        return flops(self.shape) / t.median / 1e9 if t else None


def build_methods(shape: Shape, dtype: type, x: np.ndarray) -> tuple[Any, dict[str, Callable[[], Any]]]:
    """The engine's layer, and closures for each method on its weights and the same inputs."""
    _, _, d, h = shape
    mha = attention.MultiHeadAttention(d, h, seed=0)
    sw = seed_weights(mha, dtype)
    methods: dict[str, Callable[[], Any]] = {
        "seed": lambda: seed_forward(x, sw),
        "eng+w": lambda: mha(x, return_weights=True),
        "eng": lambda: mha(x, return_weights=False),
    }
    if shape == TARGET_SHAPE:
        floor_w = [np.ascontiguousarray(w, dtype=dtype) for w in (fused_in_proj(mha), mha.w_o)]
        methods[FLOOR_METHOD] = lambda: floor_forward(x, *floor_w, h)
    if torch is not None:
        tx = torch.from_numpy(x)
        module = build_torch_mha(mha, dtype)
        w_qkv = to_torch(fused_in_proj(mha), dtype)
        w_o = to_torch(mha.w_o, dtype)
        methods["mha"] = lambda: torch_mha_forward(module, tx)
        methods["sdpa"] = lambda: (torch_sdpa_forward(tx, w_qkv, w_o, h), None)
    return mha, methods


def run_shape(shape: Shape, dtype: type, budget: float, seed_budget: float, retries: int) -> Row:
    """Measure one shape and dtype; while other processes skewed it, measure again (up to `retries` times).

    Keeps the attempt during which other processes were least busy.
    """
    best = measure_shape(shape, dtype, budget, seed_budget)
    for _ in range(retries):
        if best.others <= NOISY_CORES:
            break
        again = measure_shape(shape, dtype, budget, seed_budget)
        best = min(best, again, key=lambda r: r.others)
    return best


def measure_shape(shape: Shape, dtype: type, budget: float, seed_budget: float) -> Row:
    """Check agreement, then time every method and measure the engine's memory for one shape and dtype."""
    x = make_inputs(shape, dtype)
    mha, methods = build_methods(shape, dtype, x)
    results = {name: fn() for name, fn in methods.items()}
    row = Row(shape, np.dtype(dtype).name)
    row.check, ok = check_agreement(results, dtype)
    if not ok:
        raise SystemExit(f"{shape} {row.dtype}: methods disagree, not timing them.\n{row.check}")
    budgets = {name: seed_budget if name == "seed" else budget for name in methods}
    libraries = ((*NUMPY_METHODS, FLOOR_METHOD), TORCH_METHODS)
    groups = [{k: v for k, v in methods.items() if k in lib} for lib in libraries]
    load = OtherLoad()
    row.times = measure_groups([g for g in groups if g], budgets)
    row.others = load.cores()
    row.memory = engine_memory(mha, x)
    return row


# -------------------------------------------------------------------------------------- matmul peak
def matmul_gflops(dtype: type, n: int = MATMUL_N, budget: float = 1.5) -> float:
    """GFLOP/s of an n x n np.matmul (into a preallocated output) in this run."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    out = np.empty((n, n), dtype=dtype)
    t = measure(lambda: np.matmul(a, b, out=out), budget)
    return 2 * n**3 / t.median / 1e9


# ------------------------------------------------------------------------------------------- report
def print_matmul(when: str, gflops: dict[str, float]) -> None:
    """One line of same-run np.matmul GFLOP/s (the best of before/after is the reference)."""
    print(f"np.matmul {MATMUL_N}x{MATMUL_N} {when}: "
          + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in gflops.items()), flush=True)


def fmt(v: float | None, spec: str = "8.2f") -> str:
    """Format a number or a dash."""
    return format(v, spec) if v is not None else format("-", ">" + (spec[:-1].split(".")[0] or "1"))


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing."""
    return a / b if a is not None and b is not None else None


def table_line(r: Row, peak: dict[str, float]) -> str:
    """One table row: medians, ratios, GFLOP/s, memory ratio, other processes' load."""
    gf = r.gflops("eng")
    cells = [
        f"{','.join(map(str, r.shape)):>15} {r.dtype:>7}",
        *(fmt(r.ms(m), spec) for m, spec in zip(NUMPY_METHODS + TORCH_METHODS, ("9.3f",) + ("8.3f",) * 4,
                                                strict=True)),
        fmt(ratio(r.ms("mha"), r.ms("eng+w")), "9.2f"),
        fmt(ratio(r.ms("eng"), r.ms("sdpa")), "8.2f"),
        fmt(ratio(r.ms("seed"), r.ms("eng+w")), "10.1f"),
        fmt(gf, "8.1f"),
        fmt(None if gf is None else 100 * gf / peak[r.dtype], "6.0f") + "%",
        fmt(r.memory.ratio if r.memory else None, "5.2f"),
        f"{r.others:4.2f}{'!' if r.others > NOISY_CORES else ' '}",
    ]
    return " ".join(cells)


def print_table(rows: Sequence[Row], peak: dict[str, float]) -> None:
    """Medians (ms), ratios, GFLOP/s and memory, one line per shape and dtype."""
    print("\nmedian ms per call (B,n,d_model,h); ratios >1 favour the engine except eng/sdpa (<=1.25 target)")
    head = (f"{'shape':>15} {'dtype':>7} {'seed':>9} {'eng+w':>8} {'eng':>8} {'mha':>8} {'sdpa':>8} "
            f"{'mha/eng+w':>9} {'eng/sdpa':>8} {'seed/eng+w':>10} {'eng GF/s':>8} {'%matmul':>7} {'mem':>5} "
            f"{'oth':>5}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(table_line(r, peak))
    slow = [f"{','.join(map(str, r.shape))} {r.dtype} ({r.times['seed'].rounds} run)"
            for r in rows if r.times["seed"].rounds < 3]
    print("timed rounds: adaptive, >= 6 where a call fits the budget; seed loop timed fewer times: "
          + (", ".join(slow) if slow else "none"))
    print("%matmul = eng GFLOP/s / best same-run 2048^2 np.matmul GFLOP/s of that dtype")
    print("mem = (inputs + engine peak extra) / (inputs + returned + one n*n score block): <= ~1 meets target")
    print(f"oth = cores other processes kept busy while the row was timed; '!' (> {NOISY_CORES}): row is skewed")


def verdict(ok: bool | None) -> str:
    """PASS / MISS / n/a."""
    return "n/a " if ok is None else ("PASS" if ok else "MISS")


def target_lines(r: Row, peak: dict[str, float]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, ok) for one (4,1024,512,8) row."""
    speedup = ratio(r.ms("mha"), r.ms("eng+w"))
    vs_sdpa = ratio(r.ms("eng"), r.ms("sdpa"))
    frac = r.gflops("eng") / peak[r.dtype]
    m = r.memory
    lines = [
        ("eng+w >= 2x faster than torch MHA", f"{fmt(speedup, '.2f')}x",
         None if speedup is None else speedup >= 2),
        ("eng (no weights) within 1.25x of torch matmul+SDPA", f"{fmt(vs_sdpa, '.2f')}x",
         None if vs_sdpa is None else vs_sdpa <= 1.25),
    ]
    if r.ms(FLOOR_METHOD) is not None:  # information, not a target: see floor_forward
        lines.append(("  numpy floor (bare calls, no weights): eng/floor, floor/sdpa",
                      f"{r.ms(FLOOR_METHOD):.1f} ms: {fmt(ratio(r.ms('eng'), r.ms(FLOOR_METHOD)), '.2f')}x, "
                      f"{fmt(ratio(r.ms(FLOOR_METHOD), r.ms('sdpa')), '.2f')}x", None))
    note = "" if r.dtype == "float32" else " (float32 target)"
    lines.append((f"eng >= 60% of same-run matmul GFLOP/s{note}",
                  f"{100 * frac:.0f}% ({r.gflops('eng'):.1f} of {peak[r.dtype]:.1f})",
                  frac >= 0.6 if r.dtype == "float32" else None))
    if m is not None:
        mib = 2.0**20
        lines.append(("peak memory ~ inputs + returned + one score tile",
                      f"{(m.inputs + m.peak_extra) / mib:.0f} MiB vs {m.budget / mib:.0f} MiB "
                      f"(returned {m.returned / mib:.0f}, inputs {m.inputs / mib:.0f}) = {m.ratio:.2f}x",
                      m.ratio <= 1.1))
    return lines


def print_targets(rows: Sequence[Row], peak: dict[str, float]) -> None:
    """PASS/MISS against issue 2's targets at (4,1024,512,8)."""
    targets = [r for r in rows if r.shape == TARGET_SHAPE]
    if not targets:
        return
    print(f"\ntargets at {TARGET_SHAPE} (issue 2, point 9)")
    for r in targets:
        for name, measured, ok in target_lines(r, peak):
            print(f"  {verdict(ok)}  {r.dtype:7}  {name:<55} {measured}")


# --------------------------------------------------------------------------------------------- main
def parse_shape(text: str) -> Shape:
    """'B,n,d_model,h' -> tuple."""
    parts = tuple(int(p) for p in text.split(","))
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"shape must be B,n,d_model,h, got {text!r}")
    return parts  # type: ignore[return-value]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes only: " + str(QUICK_SHAPES))
    p.add_argument("--shapes", type=parse_shape, nargs="+", metavar="B,n,d,h", help="shapes to run")
    p.add_argument("--dtype", choices=("float64", "float32", "both"), default="both")
    p.add_argument("--budget", type=float, default=1.0, help="seconds of timing per method and shape (1.0)")
    p.add_argument("--seed-budget", type=float, default=2.0,
                   help="seconds of timing for the seed loop; a slower single call is timed once (2.0)")
    p.add_argument("--retries", type=int, default=1,
                   help="re-measure a shape up to this many times while other processes skew it (1)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print the report."""
    args = parse_args(argv)
    shapes = args.shapes or (QUICK_SHAPES if args.quick else ALL_SHAPES)
    dtypes = [np.float64, np.float32] if args.dtype == "both" else [np.dtype(args.dtype).type]
    blas = blas_info()
    setup_torch(int(blas.get("num_threads") or 1))
    print_environment(blas)
    print(f"engine: {Path(attention.__file__).resolve()}")
    t0 = time.perf_counter()
    before = {np.dtype(dt).name: matmul_gflops(dt) for dt in dtypes}
    print_matmul("before", before)
    rows = []
    for shape in shapes:
        for dt in dtypes:
            row = run_shape(shape, dt, args.budget, args.seed_budget, args.retries)
            print(f"{','.join(map(str, shape)):>15} {row.dtype:>7}  {row.check}", flush=True)
            rows.append(row)
    after = {np.dtype(dt).name: matmul_gflops(dt) for dt in dtypes}
    print_matmul("after", after)
    peak = {k: max(v, after[k]) for k, v in before.items()}
    print_table(rows, peak)
    print_targets(rows, peak)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; {load_average()}")


if __name__ == "__main__":
    main()
