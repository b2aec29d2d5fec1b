"""Benchmark (issue 5): end-to-end HTTP time of v1 JSON, v2 JSON and v2 binary against the engine's compute.

Run:  .venv/bin/python benchmarks/v2.py                 (B=1, n=512, d_model=512, h=8, weights returned)
      .venv/bin/python benchmarks/v2.py --repeat 5 --shape 1,128,256,4

It starts the real gunicorn (service/gunicorn.conf.py, one sync worker, one BLAS thread) on a free
loopback port, with max_weight_elements raised to fit B*h*n*n, and times in the same run, round-robin:
  engine     MultiHeadAttention(d_model, h, seed=0)(X, return_weights=True) in this process (one BLAS
             thread and the malloc settings of a worker too), the layer built once; "engine+build"
             also draws the seeded weights each time (as every request does);
  v1 json    POST /v1/multi-head-attention {"embeddings", "n_heads"}; body orjson, answer orjson-parsed to arrays;
  v2 json    POST /v2/models/multi_head_attention/infer with JSON data in and out;
  v2 binary  the same with the binary tensor data extension in and out (raw little-endian bytes),
             the answer turned into arrays with np.frombuffer;
  triton     v2 binary through tritonclient.http (the official client's own overhead included).
The client is http.client (one read of the whole answer), each request on a new connection as
gunicorn's sync workers close them anyway. Every method's answer is checked against the engine's before
timing. Medians and ratios to the engine's compute are printed; target: v2 binary within 1.5x.
This is a benchmark, not a test: nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import http.client
import os
import runpy
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # as each gunicorn worker: a fair baseline

import numpy as np  # noqa: E402  (after the thread settings)
import orjson  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attention  # noqa: E402
from tests.harness import Gunicorn  # noqa: E402

HEADER = "Inference-Header-Content-Length"
MODEL = "/v2/models/multi_head_attention/infer"


@dataclass(frozen=True)
class Server:
    """The running gunicorn's port, and one HTTP exchange per call on a new connection."""

    port: int

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()


def v1_json(server: Server, x: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
    body = orjson.dumps({"embeddings": x, "n_heads": heads}, option=orjson.OPT_SERIALIZE_NUMPY)
    status, _, raw = server.request("POST", "/v1/multi-head-attention", body, {"Content-Type": "application/json"})
    assert status == 200, raw[:300]
    answer = orjson.loads(raw)
    return np.array(answer["output"]), np.array(answer["weights"])


def v2_json(server: Server, x: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
    body = orjson.dumps({"inputs": [{"name": "embeddings", "shape": x.shape, "datatype": "FP64", "data": x.ravel()}],
                         "parameters": {"num_heads": heads}}, option=orjson.OPT_SERIALIZE_NUMPY)
    status, _, raw = server.request("POST", MODEL, body, {"Content-Type": "application/json"})
    assert status == 200, raw[:300]
    output, weights = orjson.loads(raw)["outputs"]
    return (np.array(output["data"]).reshape(output["shape"]), np.array(weights["data"]).reshape(weights["shape"]))


def v2_binary(server: Server, x: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
    header = orjson.dumps({"inputs": [{"name": "embeddings", "shape": x.shape, "datatype": "FP64",
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "parameters": {"num_heads": heads, "binary_data_output": True}})
    status, headers, raw = server.request("POST", MODEL, header + x.tobytes(), {HEADER: str(len(header))})
    assert status == 200, raw[:300]
    split = int(headers[HEADER])
    arrays, offset = [], split
    for output in orjson.loads(raw[:split])["outputs"]:
        size = output["parameters"]["binary_data_size"]
        arrays.append(np.frombuffer(raw, "<f8", size // 8, offset).reshape(output["shape"]))
        offset += size
    return arrays[0], arrays[1]


def triton(server: Server, x: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
    import tritonclient.http as client

    embeddings = client.InferInput("embeddings", list(x.shape), "FP64")
    embeddings.set_data_from_numpy(x, binary_data=True)
    with client.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=120) as connection:
        result = connection.infer("multi_head_attention", [embeddings], parameters={"num_heads": heads})
    return result.as_numpy("output"), result.as_numpy("weights")


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="1,512,512,8", help="B,n,d_model,h (default 1,512,512,8)")
    parser.add_argument("--repeat", type=int, default=15, help="timed rounds (default 15)")
    args = parser.parse_args(argv)
    batch, n, d_model, heads = (int(v) for v in args.shape.split(","))
    # The engine baseline runs with the workers' malloc settings too (gunicorn.conf.py's post_fork).
    runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))["post_fork"](None, None)
    x = np.random.default_rng(0).normal(size=(batch, n, d_model))
    layer = attention.MultiHeadAttention(d_model, heads, seed=0)
    expected = layer(x, return_weights=True)

    def engine() -> None:
        layer(x, return_weights=True)

    def engine_build() -> None:
        attention.MultiHeadAttention(d_model, heads, seed=0)(x, return_weights=True)

    env = {"WEB_CONCURRENCY": "1", "ATTENTION_MAX_WEIGHT_ELEMENTS": str(batch * heads * n * n),
           "GUNICORN_TIMEOUT": "120"}
    with Gunicorn(env) as running:
        server = Server(urlsplit(running.url).port)
        methods: dict[str, Callable[[], object]] = {
            "engine": engine, "engine+build": engine_build,
            "v1 json": lambda: v1_json(server, x, heads), "v2 json": lambda: v2_json(server, x, heads),
            "v2 binary": lambda: v2_binary(server, x, heads), "triton": lambda: triton(server, x, heads)}
        for name, method in methods.items():  # warm-up, and the answers agree with the engine's
            answer = method()
            if answer is not None:
                for got, want in zip(answer, expected, strict=True):
                    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=name)
        samples: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(args.repeat):  # round-robin, so drift on this shared machine hits all alike
            for name, method in methods.items():
                start = time.perf_counter()
                method()
                samples[name].append(time.perf_counter() - start)

    base = median_ms(samples["engine"])
    print(f"multi-head attention, B={batch} n={n} d_model={d_model} h={heads}, float64, weights returned; "
          f"median of {args.repeat}")
    build = median_ms(samples["engine+build"])
    print(f"{'method':<14}{'median ms':>11}{'x engine':>10}{'x engine+build':>16}")
    for name, values in samples.items():
        ms = median_ms(values)
        print(f"{name:<14}{ms:>11.1f}{ms / base:>10.2f}{ms / build:>16.2f}")
    for baseline in ("engine", "engine+build"):
        ratio = median_ms(samples["v2 binary"]) / median_ms(samples[baseline])
        print(f"target v2 binary <= 1.5x {baseline}: {'PASS' if ratio <= 1.5 else 'MISS'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
