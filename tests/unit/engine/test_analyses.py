"""attention/analyses.py and the forward passes' ``norms_of``: attention rollout, attention flow and norm-based
attention against their definitions computed independently (tests/unit/engine/analyses_reference.py: plain loops,
networkx), by hand on two tokens and on the toy encoder, and on MiniLM and the decoder with transformers' attentions
and modules; the invariants (rollout rows sum to 1, flows in [0, 1], causality); the forward passes unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attention
from attention import AttentionError, flow, rollout
from attention.vocabulary import embed
from tests.unit.engine.analyses_reference import (
    flow_by_networkx,
    norms_by_loops,
    relative,
    rollout_by_loops,
)

pytestmark = pytest.mark.usefixtures("one_thread_each")

SENTENCE = "The animal didn't cross the street because it was too tired."
SHORT = "The cat sat on the mat."           # 8 word pieces for MiniLM, 7 tokens for the decoder: flows by networkx
DTYPES = [np.float32, np.float64]
# Agreement with the definitions, relative to the largest value: float32 measured at most 6.7e-6 for the decoder's
# norms against transformers (whose float32 hidden states the engine's match to 7.6e-6), 2.3e-6 for MiniLM's, 3.6e-7
# for rollouts; float64 at most 6.3e-15. Flows against networkx: 3.1e-6 (capacities in whole millionths).
NORMS = {np.float32: 1e-5, np.float64: 1e-12}
ROLLOUT = {np.float32: 1e-5, np.float64: 1e-12}
FLOW = 1e-5


def random_weights(rng: np.random.Generator, shape: tuple[int, ...], causal: bool = False) -> np.ndarray:
    """Rows of softmax-like weights (..., n, n), peaked, zero above the diagonal when ``causal``."""
    w = rng.random(shape) ** 4
    if causal:
        w = np.tril(w)
    return w / w.sum(axis=-1, keepdims=True)


# --- by hand ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_two_tokens_by_hand(dtype):
    """One head, token 1 looking half at token 0: A_hat = [[1, 0], [1/4, 3/4]] in each of two layers. Rollout
    multiplies: 1/4 + 3/4 * 1/4 = 7/16 of token 0 in position 1. Flow takes two disjoint pipes from token 0,
    straight to (1, 0) then across (capacity 1/4), or across first (1/4) then straight (3/4): 1/2; token 1
    reaches position 1 only straight through, 3/4: flows need not sum to 1."""
    layer = np.array([[[1.0, 0.0], [0.5, 0.5]]], dtype)                       # (h=1, n=2, n=2)
    rolled = rollout([layer, layer])
    np.testing.assert_allclose(rolled[0], [[1, 0], [0.25, 0.75]], atol=1e-7)
    np.testing.assert_allclose(rolled[1], [[1, 0], [7 / 16, 9 / 16]], atol=1e-7)
    np.testing.assert_allclose(flow([layer, layer]), [[1, 0], [0.5, 0.75]], atol=1e-6)
    assert rolled[1].dtype == flow([layer]).dtype == dtype
    np.testing.assert_allclose(flow([layer]), rolled[0], atol=1e-6)       # one layer: each pair is one edge


def test_the_toy_encoder_by_hand():
    """The seed's vocabulary through the toy encoder (no biases), causally: "the" is the zero vector, so whatever
    weight a head puts on it, it moves nothing (its column of layer 0's norms is 0); "cat" is e_0, so what it
    moves is row 0 of W_V^h through W_O's rows of head h. Token 0 sees only itself: its rollout row is e_0."""
    encoder = attention.Encoder(4, 2, n_layers=3, seed=0)
    x = embed(["the", "cat", "ate", "food", "it"])                           # (5, 4)
    out = encoder.with_norms(x, causal=True)
    first, heads = out.norms[0], encoder.blocks[0].attention
    assert (out.weights[0][:, 1:, 0] > 0.05).all()                          # it is weighed...
    assert not first.heads[:, :, 0].any() and not first.layer[:, 0].any()   # ...and moves nothing
    for h in range(2):
        cat = heads.w_v[h][0] @ heads.w_o[2 * h:2 * h + 2]                    # f_h("cat") = e_0 W_V^h W_O^h
        np.testing.assert_allclose(first.heads[h, 1:, 1], out.weights[0][h, 1:, 1] * np.linalg.norm(cat), rtol=1e-12)
    for rolled in rollout(out.weights):
        np.testing.assert_array_equal(rolled[0], [1, 0, 0, 0, 0])
        np.testing.assert_allclose(rolled.sum(axis=-1), 1, rtol=1e-14)


# --- the definitions on a small model --------------------------------------------------------------------------------

def toy_layers(dtype: type, causal: bool) -> tuple[attention.Encoder, np.ndarray, attention.EncoderOutput]:
    """A 3-layer toy encoder (d_model 8, 2 heads) on a batch of two random sentences of 7 tokens."""
    encoder = attention.Encoder(8, 2, n_layers=3, d_ff=16, seed=5)
    x = np.random.default_rng(3).normal(size=(2, 7, 8)).astype(dtype)
    return encoder, x, encoder.with_norms(x, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rollout_and_flow_equal_their_definitions_on_the_toy_encoder(dtype, causal):
    _, _, out = toy_layers(dtype, causal)
    rolled, flows = rollout(out.weights), flow(out.weights)
    assert flows.shape == (2, 7, 7) and flows.dtype == dtype and all(r.dtype == dtype for r in rolled)
    for item in range(2):
        weights = [w[item] for w in out.weights]
        for ours, theirs in zip(rolled, rollout_by_loops(weights), strict=True):
            assert np.abs(ours[item] - theirs).max() <= ROLLOUT[dtype]
        assert np.abs(flows[item] - flow_by_networkx(weights)).max() <= FLOW
    assert flows.min() >= 0 and flows.max() <= 1                            # exactly: rows of millionths sum to 1
    for rolled_layer in rolled:
        np.testing.assert_allclose(rolled_layer.sum(axis=-1), 1, rtol=ROLLOUT[dtype])
    if causal:
        assert not np.triu(flows, 1).any() and not any(np.triu(r, 1).any() for r in rolled)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_equal_their_definition_on_the_toy_encoder(dtype, causal):
    encoder, x, out = toy_layers(dtype, causal)
    for block, weights, norms in zip(encoder.blocks, out.weights, out.norms, strict=True):
        heads = block.attention
        assert norms.heads.shape == (2, 2, 7, 7) and norms.layer.shape == (2, 7, 7) and norms.layer.dtype == dtype
        for item in range(2):
            transformed = np.stack([x[item].astype(np.float64) @ heads.w_v[h] @ heads.w_o[4 * h:4 * h + 4]
                                    for h in range(2)])                      # (h, n, d_model): x W_V^h W_O^h
            by_head, by_layer = norms_by_loops(weights[item], transformed)
            assert relative(norms.heads[item], by_head) <= NORMS[dtype]
            assert relative(norms.layer[item], by_layer) <= NORMS[dtype]
        x = block(x, causal=causal)[0]


def test_the_toy_encoders_forward_is_unchanged_by_its_norms():
    encoder, x, out = toy_layers(np.float32, causal=True)
    output, weights = encoder(x, causal=True)
    np.testing.assert_array_equal(out.output, output)
    for ours, theirs in zip(out.weights, weights, strict=True):
        np.testing.assert_array_equal(ours, theirs)


# --- MiniLM, with transformers' attentions and modules ---------------------------------------------------------------

def run_catching(model, ids: np.ndarray, modules: list) -> tuple:
    """A transformers model on ids (1, n) with its attentions and hidden states, and the output of each of
    ``modules`` (n, d_model), caught on the way by forward hooks."""
    caught: list[np.ndarray] = []
    hooks = [module.register_forward_hook(lambda module, args, output: caught.append(output[0].detach().numpy()))
             for module in modules]
    try:
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(ids), output_attentions=True, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    return out, caught


def minilm_reference(model, ids: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """transformers' BertModel on ids (1, n): per layer its attentions (h, n, n), f_h(x_j) = (x W_V + b_V)[h] W_O[h]
    computed from its modules (h, n, d_model), and its attention sub-layer's output before the residual (n, d_model),
    caught at the output dense layer."""
    out, caught = run_catching(model, ids, [layer.attention.output.dense for layer in model.encoder.layer])
    h = model.config.num_attention_heads
    transformed = []
    for index, layer in enumerate(model.encoder.layer):
        with torch.no_grad():
            values = layer.attention.self.value(out.hidden_states[index])[0].numpy()          # (n, d_model)
        w_o = layer.attention.output.dense.weight.detach().numpy()                           # (d_out, d_in)
        d_k = values.shape[-1] // h
        transformed.append(np.stack([values[:, s:s + d_k] @ w_o[:, s:s + d_k].T for s in range(0, h * d_k, d_k)]))
    return [a[0].numpy() for a in out.attentions], transformed, caught


@pytest.mark.parametrize("dtype", DTYPES)
def test_minilm_norms_equal_their_definition_with_transformers_modules(minilm, hf_bert, dtype):
    ids = minilm.tokenizer.encode(SENTENCE).ids[None]
    ours = minilm.bert(ids, dtype=dtype, norms_of=None)
    model = hf_bert[dtype]
    attentions, transformed, sublayer = minilm_reference(model, ids)
    for index, (weights, f, before_residual) in enumerate(zip(attentions, transformed, sublayer, strict=True)):
        b_o = model.encoder.layer[index].attention.output.dense.bias.detach().numpy()
        split = np.einsum("hij,hjd->id", weights, f) + b_o                   # sum over keys and heads, + b_O
        assert relative(split, before_residual) <= NORMS[dtype]              # the split is exact: W_O is linear
        by_head, by_layer = norms_by_loops(weights, f)
        norms = ours.norms[index]
        assert norms.heads.shape == (1, 12, ids.shape[1], ids.shape[1]) and norms.layer.dtype == dtype
        assert relative(norms.heads[0], by_head) <= NORMS[dtype]
        assert relative(norms.layer[0], by_layer) <= NORMS[dtype]


def test_minilm_rollout_and_flow_equal_their_definitions_on_transformers_attentions(minilm, hf_bert):
    ids = minilm.tokenizer.encode(SHORT).ids[None]
    assert ids.shape[1] <= 12
    ours = minilm.bert(ids)
    attentions = minilm_reference(hf_bert[np.float32], ids)[0]
    for mine, theirs in zip(rollout(ours.weights), rollout_by_loops(attentions), strict=True):
        assert np.abs(mine[0] - theirs).max() <= ROLLOUT[np.float32]
    flows = flow(ours.weights)
    assert np.abs(flows[0] - flow_by_networkx(attentions)).max() <= FLOW
    assert flows.min() >= 0 and flows.max() <= 1


def test_minilm_norms_leave_the_forward_pass_as_it_was(minilm):
    ids = minilm.tokenizer.encode(SENTENCE).ids[None]
    plain = minilm.bert(ids, hidden_states=True)
    normed = minilm.bert(ids, hidden_states=True, norms_of=[0, 5])
    assert plain.norms is None and [m is None for m in normed.norms] == [False, True, True, True, True, False]
    for a, b in zip([plain.output, *plain.weights, *plain.hidden_states],
                    [normed.output, *normed.weights, *normed.hidden_states], strict=True):
        np.testing.assert_array_equal(a, b)
    some = minilm.bert(ids, weights_of=[5], heads=[7, 2], norms_of=[0, 5])  # the norms take every head regardless
    np.testing.assert_array_equal(some.weights[5], plain.weights[5][:, [7, 2]])
    assert some.weights[0] is None
    for layer in (0, 5):
        np.testing.assert_array_equal(some.norms[layer].heads, normed.norms[layer].heads)
        np.testing.assert_array_equal(some.norms[layer].layer, normed.norms[layer].layer)


def test_minilm_padded_batch_analyses_equal_each_item_alone(minilm):
    texts = ["Short.", SHORT, SENTENCE]
    items = [minilm.tokenizer.encode(text).ids for text in texts]
    lengths = np.array([len(i) for i in items])
    ids = np.zeros((3, lengths.max()), np.int64)
    for row, item in enumerate(items):
        ids[row, :len(item)] = item
    batch = minilm.bert(ids, None, lengths, norms_of=None)
    rolled, flows = rollout(batch.weights, lengths=lengths), flow(batch.weights, lengths=lengths)
    for row, length in enumerate(lengths):
        alone = minilm.bert(ids[row:row + 1, :length], norms_of=None)
        real = (row, slice(0, length), slice(0, length))
        for ours, theirs in zip(rolled, rollout(alone.weights), strict=True):
            assert np.abs(ours[real] - theirs[0]).max() <= 1e-5
            assert not ours[row, length:].any()
        for ours, theirs in zip(batch.norms, alone.norms, strict=True):
            assert relative(ours.layer[real], theirs.layer[0]) <= 1e-5
            assert relative(ours.heads[row, :, :length, :length], theirs.heads[0]) <= 1e-5
            assert not ours.layer[row, length:].any() and not ours.heads[row, :, length:].any()
        if length <= 12:
            assert np.abs(flows[real] - flow(alone.weights)[0]).max() <= 1e-5
        assert not flows[row, length:].any() and not flows[row, :, length:].any()


# --- the decoder: grouped-query attention, causal ---------------------------------------------------------------------

def decoder_reference(model, ids: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """transformers' Llama on ids (1, n): per layer its attentions (h, n, n), f_h(x_j) = (RMSNorm(x) W_V)[h's
    key/value head] W_O[h] from its modules (h, n, d_model), and o_proj's output (n, d_model)."""
    out, caught = run_catching(model, ids, [layer.self_attn.o_proj for layer in model.model.layers])
    config = model.config
    d_k, group = config.head_dim, config.num_attention_heads // config.num_key_value_heads
    transformed = []
    for index, layer in enumerate(model.model.layers):
        with torch.no_grad():
            values = layer.self_attn.v_proj(layer.input_layernorm(out.hidden_states[index]))[0].numpy()  # (n, h_kv d_k)
        w_o = layer.self_attn.o_proj.weight.detach().numpy()                                      # (d_model, h d_k)
        read = [values[:, h // group * d_k:(h // group + 1) * d_k] for h in range(config.num_attention_heads)]
        transformed.append(np.stack([v @ w_o[:, h * d_k:(h + 1) * d_k].T for h, v in enumerate(read)]))
    return [a[0].numpy() for a in out.attentions], transformed, caught


def test_decoder_norms_equal_their_definition_with_transformers_modules(smollm, hf_smollm):
    ids = smollm.tokenizer.encode(SENTENCE).ids[None]
    ours = smollm.llama(ids, norms_of=None, logits=None)
    attentions, transformed, sublayer = decoder_reference(hf_smollm, ids)
    for index in range(0, 30, 3):
        split = np.einsum("hij,hjd->id", attentions[index], transformed[index])      # W_O has no bias
        assert relative(split, sublayer[index]) <= NORMS[np.float32]
        by_head, by_layer = norms_by_loops(attentions[index], transformed[index])
        norms = ours.norms[index]
        assert norms.heads.shape == (1, 9, ids.shape[1], ids.shape[1])
        assert relative(norms.heads[0], by_head) <= NORMS[np.float32]
        assert relative(norms.layer[0], by_layer) <= NORMS[np.float32]
    assert not any(np.triu(m.layer, 1).any() or np.triu(m.heads, 1).any() for m in ours.norms)


def test_decoder_float64_norms_equal_their_definition_on_its_trace(smollm):
    """float64 against the engine's own trace (per head its weights and the value vectors of the key/value head it
    reads), multiplied out head by head: transformers' float64 mode keeps RMSNorm in float32."""
    ids = smollm.tokenizer.encode(SHORT).ids[None]
    ours = smollm.llama(ids, dtype=np.float64, norms_of=[0, 17, 29], logits=None)
    trace = smollm.llama.trace(ids, dtype=np.float64, layers=[0, 17, 29], logits=None)
    for index, layer in trace.layers.items():
        w_o = smollm.llama.layers[index].w_o.astype(np.float64)                     # (h d_k, d_model)
        transformed = np.stack([layer.attention.v[0, h] @ w_o[64 * h:64 * (h + 1)] for h in range(9)])
        by_head, by_layer = norms_by_loops(layer.attention.weights[0], transformed)
        assert ours.norms[index].layer.dtype == np.float64
        assert relative(ours.norms[index].heads[0], by_head) <= NORMS[np.float64]
        assert relative(ours.norms[index].layer[0], by_layer) <= NORMS[np.float64]


def test_decoder_rollout_and_flow_are_causal_and_equal_their_definitions(smollm, hf_smollm):
    ids = smollm.tokenizer.encode(SHORT).ids[None]
    assert ids.shape[1] <= 12
    ours = smollm.llama(ids, logits=None)
    attentions = decoder_reference(hf_smollm, ids)[0]
    rolled, flows = rollout(ours.weights), flow(ours.weights)
    for mine, theirs in zip(rolled, rollout_by_loops(attentions), strict=True):
        assert np.abs(mine[0] - theirs).max() <= ROLLOUT[np.float32]
        assert not np.triu(mine, 1).any()                                    # row i: no weight past i
    assert np.abs(flows[0] - flow_by_networkx(attentions)).max() <= FLOW
    assert not np.triu(flows, 1).any() and flows.min() >= 0 and flows.max() <= 1
    assert flows[0, 0, 0] == 1                                               # the first token sees only itself


def test_decoder_norms_leave_the_forward_pass_as_it_was_and_read_the_cache(smollm):
    ids = smollm.tokenizer.encode(SENTENCE).ids[None]
    plain = smollm.llama(ids, logits="all")
    normed = smollm.llama(ids, logits="all", weights_of=[3], heads=[8, 0], norms_of=[3, 29])
    np.testing.assert_array_equal(normed.logits, plain.logits)
    np.testing.assert_array_equal(normed.weights[3], plain.weights[3][:, [8, 0]])
    assert normed.weights[29] is None and normed.norms[0] is None
    cache, _ = smollm.llama.prefill(ids[:, :5])
    rest = smollm.llama(ids[:, 5:], cache=cache, norms_of=[3, 29])            # the new rows over every key so far
    for layer in (3, 29):
        assert rest.norms[layer].heads.shape == (1, 9, ids.shape[1] - 5, ids.shape[1])
        assert relative(rest.norms[layer].heads, normed.norms[layer].heads[:, :, 5:]) <= 1e-5
        assert relative(rest.norms[layer].layer, normed.norms[layer].layer[:, 5:]) <= 1e-5


# --- arguments -------------------------------------------------------------------------------------------------------

LAYER = np.full((1, 2, 3, 3), 1 / 3)                                         # (B, h, n, n)


@pytest.mark.parametrize(("call", "argument", "message"), [
    (lambda: rollout([]), "weights", "every layer's weights"),
    (lambda: rollout([LAYER, None]), "weights", "every layer's weights"),
    (lambda: flow([LAYER, LAYER[:, :1]]), "weights", "one shape"),
    (lambda: flow([LAYER[..., :2]]), "weights", r"\(\.\.\., h, n, n\)"),
    (lambda: rollout([LAYER.astype(int)]), "weights", "float32 or float64"),
    (lambda: rollout([LAYER, LAYER.astype(np.float32)]), "weights", "one shape"),
    (lambda: rollout([LAYER[0, 0]]), "weights", r"\(\.\.\., h, n, n\)"),
    (lambda: rollout([LAYER * np.nan]), "weights", "finite"),
    (lambda: rollout([LAYER], layers=[1]), "layers", r"\[0, 1\)"),
    (lambda: flow([LAYER], lengths=np.array([4])), "lengths", r"\(1,\) integers in \[1, 3\]"),
    (lambda: rollout([LAYER], lengths=np.array([0])), "lengths", "integers"),
    (lambda: rollout([LAYER[0]], lengths=np.array([2])), "lengths", r"\(B, h, n, n\)"),
    (lambda: attention.MultiHeadAttention(4, 2).norms(np.ones((3, 4)), LAYER[0, :, :2]), "weights", "h, n, n"),
])
def test_what_the_analyses_cannot_compute_is_refused_by_argument(call, argument, message):
    with pytest.raises(AttentionError, match=message) as caught:
        call()
    assert caught.value.argument == argument


def test_models_refuse_norms_of_layers_they_do_not_have(minilm, smollm):
    for run in (lambda: minilm.bert(np.array([[101, 102]]), norms_of=[6]),
                lambda: smollm.llama(np.array([[1, 2]]), norms_of=[30])):
        with pytest.raises(AttentionError, match="expected layers in") as caught:
            run()
        assert caught.value.argument == "norms_of"
