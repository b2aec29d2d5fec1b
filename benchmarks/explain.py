"""Benchmark (issues 33 and 34, the service halves): POST /v1/models/{model}/explain against the engine's own
analyses and interventions, MiniLM.

Run:  .venv/bin/python benchmarks/explain.py            (about 1 min)
      .venv/bin/python benchmarks/explain.py --rounds 31

What the endpoint adds to the engine: the body parsed and validated, the text tokenized, the request sized and
checked, the answer rounded and written as JSON (orjson), in-process through Flask's test client (no socket: the
HTTP stack's own cost is benchmarks/http_load.py's). Each row is paired, in interleaved rounds (benchmarks/model.py's
``interleaved``): ``engine`` tokenizes the text and runs the forward pass with the analyses (attention/analyses.py),
or the knockout of every head or the occlusion of every word piece (attention/interventions.py); ``endpoint`` posts
the same request. Reported: the median ms of each, the median per-round ratio endpoint/engine
and its 95% interval (sign test). One BLAS thread, the workers' heap settings, as benchmarks/analyses.py.
This is a benchmark, not a test: nothing asserts timings.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import Any

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"  # one BLAS thread, as each service worker runs
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's attention/, service/ and benchmarks/, before any installed copy

import numpy as np  # noqa: E402  (after the thread settings)

from attention import encoder_knockout, encoder_occlusion, flow, occludable, rollout  # noqa: E402
from benchmarks.analyses import row  # noqa: E402
from benchmarks.decoder import blas_kernel  # noqa: E402
from benchmarks.model import PARAGRAPH  # noqa: E402
from service.edge import create_app  # noqa: E402
from service.operations import catalogue  # noqa: E402

MODEL = "all-minilm-l6-v2"
# (methods, word pieces, layers): rollout and norms at 128 tokens, flow at max_flow_tokens. Norms of every layer at
# 128 tokens are past the default max_weight_elements (72 heads' weights held, 78 maps returned: 2.46 M > 2^21).
# Knockout of every head and occlusion of every word piece: at 16 tokens (and knockout at 128, the sizes).
CASES = ((("rollout",), 128, None), (("norms",), 128, [5]), (("rollout", "norms"), 128, [0, 5]),
         (("flow",), 32, None), (("knockout",), 16, None), (("knockout",), 128, None), (("occlusion",), 16, None))
SLOW = {"flow", "knockout", "occlusion"}  # a third of the rounds


def text_of(tokenizer: Any, n: int) -> str:
    """The longest prefix of PARAGRAPH (in words) that the tokenizer makes at most n word pieces, [CLS] and [SEP]
    counted."""
    words = PARAGRAPH.split()
    while len(tokenizer.encode(" ".join(words)).tokens) > n:
        words.pop()
    return " ".join(words)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds (21; flow a third of them)")
    args = parser.parse_args(argv)
    runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))["post_fork"](None, None)  # the workers' heap
    print(f"numpy {np.__version__}, BLAS: {blas_kernel()}; cpus {os.cpu_count()}, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    client = create_app({"TESTING": True}).test_client()
    model = catalogue.lookup(MODEL).pretrained
    mask_id = model.tokenizer.token_id("[MASK]")
    print(f"\n   {'what':>24} | {'engine ms':>10} | {'endpoint ms':>11} | {'ratio':>9} | {'95% interval':>12} |")
    for methods, n, layers in CASES:
        text = text_of(model.tokenizer, n)
        body = {"text": text, "methods": list(methods), **({"layers": layers} if layers else {})}

        def engine(text: str = text, methods: tuple[str, ...] = methods, layers: list[int] | None = layers) -> Any:
            encoding = model.tokenizer.encode(text)
            if "knockout" in methods:
                return encoder_knockout(model.bert, encoding.ids, encoding.type_ids)
            if "occlusion" in methods:
                return encoder_occlusion(model.bert, encoding.ids, occludable(encoding.special), mask_id,
                                         encoding.type_ids)
            out = model.bert(encoding.ids[None], encoding.type_ids[None], norms_of=layers if "norms" in methods else ())
            return (rollout(out.weights, layers=layers) if "rollout" in methods else None,
                    flow(out.weights) if "flow" in methods else None)

        def endpoint(body: dict[str, Any] = body) -> Any:
            response = client.post(f"/v1/models/{MODEL}/explain", json=body)
            assert response.status_code == 200, response.get_data(as_text=True)
            return response.data

        tokens = len(model.tokenizer.encode(text).tokens)
        rounds = args.rounds if not SLOW & set(methods) else max(7, args.rounds // 3)
        chosen = f", layers {layers}" if layers else ""
        row(f"{'+'.join(methods)}, {tokens} tokens{chosen}", engine, endpoint, rounds, None)


if __name__ == "__main__":
    main()
