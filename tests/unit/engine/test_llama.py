"""attention/llama.py on the real SmolLM2-135M-Instruct (Q4_1 GGUF), against transformers' LlamaForCausalLM on the same
file: every position's logits, every layer's attention weights and hidden states, in float32 (transformers) and
float64 (an all-float64 numpy reference: tests/unit/engine/llama_reference.py says why not transformers'); greedy
continuations token for token with transformers' ``generate``; cached decoding against recomputing; a padded batch;
the trace; the logit lens; the refusal of what the model cannot compute."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention import AttentionError, Decoder, LlamaConfig
from attention.generation import Generation, GenerationOptions
from attention.sampling import Sampler, Sampling
from tests.unit.engine.llama_reference import float64_reference, max_relative, run_transformers
from tests.unit.engine.reference import max_difference

LONG = (  # 222 tokens of real text
    "A teacher wants to show her students what a trained model looks at when it reads a sentence, so she types one "
    "in and picks a layer and a head. Each row of the heatmap is a word asking a question, each column a word that "
    "may answer it, and the colour says how much attention the question pays to the answer. In the early layers "
    "most heads look at the next or the previous word; later on, some heads link a pronoun to the noun it stands "
    "for, or a verb to its subject, and a few spend almost all of their attention on the first token of the text, "
    "as if they had nothing to say. A decoder is stranger still: it may only look back, so the first token, which "
    "every later one can see, becomes a place to park attention that has nowhere better to go. Numbers such as "
    "1,234.5 and 2026 are read one digit at a time. None of this was taught: the patterns grew out of predicting the "
    "next word, billions of times, and the picture only shows where each head looked.")
PROMPTS = {
    "plain": "The animal didn't cross the street because it was too tired.",
    "unicode": "Crème brûlée à Zürich costs 12 €, 東京タワー 🤖 said: x² + y² = z²",
    "chat": [{"role": "user", "content": "What is the capital of France?"}],
    "chat-turns": [{"role": "system", "content": "You are a terse assistant."},
                   {"role": "user", "content": "Name three prime numbers."},
                   {"role": "assistant", "content": "2, 3 and 5."},
                   {"role": "user", "content": "And the next one?"}],
    "long": LONG,
}
# Greedy continuations: three texts and two chats.
GREEDY = {"plain": PROMPTS["plain"], "story": "Once upon a time, in a small village by the sea,",
          "code": "def fibonacci(n):\n    ", "chat": PROMPTS["chat"],
          "chat-explain": [{"role": "user", "content": "Explain in two sentences why the sky is blue."}]}
NEW_TOKENS = 48
# The engine's promise against transformers (float32) and the float64 reference. Measured over PROMPTS: float32
# logits at most 1.2e-4, attention weights 8.1e-6, hidden states 7.6e-6 of their layer's largest value (layer 11's
# output, just before the activations jump from ~100 to ~22,000; 7.4e-6 with OpenBLAS's SkylakeX kernel, 7.6e-6
# with Haswell's); float64 logits 1.7e-13, weights 6.6e-15, hidden states 8.1e-15 relative.
BOUNDS = {np.float32: {"logits": 1e-3, "weights": 1e-4, "hidden": 1e-5},
          np.float64: {"logits": 1e-9, "weights": 1e-11, "hidden": 1e-11}}


pytestmark = pytest.mark.usefixtures("one_thread_each")


def ids_of(model: Decoder, prompt: str | list[dict]) -> np.ndarray:
    """A prompt's ids (n,): a text as it is, a conversation through the file's chat template."""
    encoded = model.tokenizer.encode(prompt) if isinstance(prompt, str) else model.tokenizer.encode_chat(prompt)
    return encoded.ids


# --- the numbers ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PROMPTS)
def test_float32_logits_weights_and_hidden_states_equal_transformers(smollm, hf_smollm, name):
    ids = ids_of(smollm, PROMPTS[name])[None]                           # (1, n)
    ours = smollm.llama(ids, logits="all", hidden_states=True)
    logits, states, weights = run_transformers(hf_smollm, ids)
    bound = BOUNDS[np.float32]
    assert ours.logits.shape == (1, ids.shape[1], 49152) and ours.logits.dtype == np.float32
    assert len(ours.weights) == 30 and ours.weights[0].shape == (1, 9, ids.shape[1], ids.shape[1])
    assert len(ours.hidden_states) == 31
    assert max_difference([ours.logits], [logits]) <= bound["logits"]
    assert max_difference(ours.weights, weights) <= bound["weights"]
    assert max_relative(ours.hidden_states, states) <= bound["hidden"]
    np.testing.assert_array_equal(ours.output, ours.hidden_states[-1])
    if name == "long":
        assert ids.shape[1] >= 200


@pytest.mark.parametrize("name", ["plain", "chat-turns", "long"])
def test_float64_equals_an_all_float64_reference(smollm, hf_smollm, name):
    """The reference is plain numpy in float64 throughout, on transformers' weights: transformers' own float64 mode
    keeps RMSNorm, softmax and the rotary angles in float32."""
    ids = ids_of(smollm, PROMPTS[name])
    ours = smollm.llama(ids[None], dtype=np.float64, logits="all", hidden_states=True)
    logits, states, weights = float64_reference(hf_smollm, ids)
    bound = BOUNDS[np.float64]
    assert ours.logits.dtype == np.float64 and all(w.dtype == np.float64 for w in ours.weights)
    assert max_difference([ours.logits[0]], [logits]) <= bound["logits"]
    assert max_difference([w[0] for w in ours.weights], weights) <= bound["weights"]
    assert max_relative([s[0] for s in ours.hidden_states], states) <= bound["hidden"]


@pytest.mark.parametrize("name", GREEDY)
def test_greedy_continuation_equals_transformers_generate(smollm, hf_smollm, name):
    """The generation loop (attention/generation.py: prefill, then one cached step a token, until the budget or
    the end-of-sequence token) at temperature 0, token for token."""
    ids = ids_of(smollm, GREEDY[name])
    generation = Generation(smollm.llama, smollm.tokenizer, ids, GenerationOptions(NEW_TOKENS), Sampler(Sampling()))
    ours = [step.token for step in generation]
    with torch.no_grad():
        theirs = hf_smollm.generate(torch.from_numpy(ids[None]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                    eos_token_id=smollm.tokenizer.eos_id, pad_token_id=smollm.tokenizer.eos_id)
    assert ours == theirs[0, len(ids):].tolist(), smollm.tokenizer.decode(ours)
    assert len(ours) >= 8                                               # a real continuation, not an instant stop
    assert generation.finish_reason == ("stop" if ours[-1] == smollm.tokenizer.eos_id else "length")


def test_cached_decoding_equals_recomputing_the_whole_sequence(smollm):
    """Prefill, then 12 steps: each step's logits, attention row and hidden states equal the full forward pass
    over the sequence so far, at its last position; the cache starts small and grows."""
    prompt = ids_of(smollm, PROMPTS["chat"])
    cache, first = smollm.llama.prefill(prompt[None], capacity=len(prompt) + 2)
    tokens = [*prompt.tolist(), int(first.logits[0].argmax())]
    for _ in range(12):
        step = smollm.llama.step(cache, np.array(tokens[-1:]), return_weights=True, weights_of=[0, 29],
                                 heads=[8, 1], hidden_states=True)
        whole = smollm.llama(np.array([tokens]), weights_of=[0, 29], heads=[8, 1], hidden_states=True)
        assert max_difference([step.logits], [whole.logits]) <= 1e-4
        assert max_difference([step.weights[i] for i in (0, 29)], [whole.weights[i][:, :, -1] for i in (0, 29)]) \
            <= 1e-5
        assert max_relative(step.hidden_states, [s[:, -1] for s in whole.hidden_states]) <= 1e-5
        assert step.weights[0].shape == (1, 2, len(tokens)) and step.weights[1] is None
        assert int(step.logits[0].argmax()) == int(whole.logits[0].argmax())
        tokens.append(int(step.logits[0].argmax()))
    assert cache.length == len(tokens) - 1 and cache.capacity >= cache.length > len(prompt) + 2


def test_a_padded_batch_equals_each_item_alone(smollm, hf_smollm):
    items = [ids_of(smollm, PROMPTS[name]) for name in ("plain", "chat", "unicode")]
    lengths = np.array([len(i) for i in items])
    n = lengths.max()
    ids = np.full((3, n), smollm.tokenizer.eos_id, np.int64)            # padded with <|im_end|>, the file's pad
    for i, item in enumerate(items):
        ids[i, :len(item)] = item
    ours = smollm.llama(ids, lengths, hidden_states=True)
    every = smollm.llama(ids, lengths, logits="all", return_weights=False)
    real = (np.arange(n) < lengths[:, None]).astype(np.int64)
    logits, states, weights = run_transformers(hf_smollm, ids, real)
    for i, length in enumerate(lengths):
        alone = smollm.llama(items[i][None], hidden_states=True)
        assert max_difference([ours.logits[i]], [alone.logits[0]]) <= 1e-4
        assert max_difference([w[i, :, :length, :length] for w in ours.weights], [w[0] for w in alone.weights]) <= 1e-5
        assert max_relative([s[i, :length] for s in ours.hidden_states], [s[0] for s in alone.hidden_states]) <= 1e-5
        assert max_difference([ours.logits[i]], [logits[i, length - 1]]) <= BOUNDS[np.float32]["logits"]
        assert max_difference([w[i, :, :length] for w in ours.weights], [w[i, :, :length] for w in weights]) \
            <= BOUNDS[np.float32]["weights"]
        assert max_relative([s[i, :length] for s in ours.hidden_states], [s[i, :length] for s in states]) \
            <= BOUNDS[np.float32]["hidden"]
        for w in ours.weights:
            assert not w[i, :, :, length:].any() and not w[i, :, length:].any()   # padded keys and rows: 0
        assert all(not s[i, length:].any() for s in ours.hidden_states)
        assert not every.logits[i, length:].any()                       # and their logits
        assert max_difference([every.logits[i, length - 1]], [ours.logits[i]]) <= 1e-4   # one gemm or another
    assert lengths.min() < n


# --- the trace and the logit lens ----------------------------------------------------------------------------------

def test_the_trace_agrees_with_the_forward_pass(smollm):
    ids = ids_of(smollm, PROMPTS["plain"])[None]
    n = ids.shape[1]
    forward = smollm.llama(ids, hidden_states=True)
    trace = smollm.llama.trace(ids, layers=[0, 17, 29], heads=[8, 0, 7])
    assert sorted(trace.layers) == [0, 17, 29]
    np.testing.assert_array_equal(trace.logits, forward.logits)
    assert max_relative(trace.hidden_states, forward.hidden_states) <= 1e-6
    for i, layer in trace.layers.items():
        stages = layer.attention
        assert stages.q.shape == stages.k.shape == stages.v.shape == (1, 3, n, 64)
        np.testing.assert_array_equal(stages.k[:, 0], stages.k[:, 2])    # heads 8 and 7 read key/value head 2
        assert max_difference([stages.weights], [forward.weights[i][:, [8, 0, 7]]]) <= 1e-6
        np.testing.assert_allclose(stages.scores / 8, stages.scaled_scores, rtol=1e-6, atol=1e-6)  # sqrt(64)
        assert stages.masked_scores.mask.tolist() == [[np.triu(np.ones((n, n), bool), 1).tolist()] * 3]
        np.testing.assert_array_equal(layer.output, layer.residual + layer.feed_forward)
        assert max_relative([layer.output], [forward.hidden_states[i + 1]]) <= 1e-6 or i == 29
        assert set(layer.as_dict()) == {"attention", "residual", "feed_forward", "output"}


def test_the_logit_lens_reads_every_layer_through_the_final_norm_and_head(smollm, hf_smollm):
    ids = ids_of(smollm, PROMPTS["plain"])
    cache, _ = smollm.llama.prefill(ids[None, :-1])
    step = smollm.llama.step(cache, ids[-1:], hidden_states=True)
    lens = smollm.llama.logit_lens(step.hidden_states)
    assert len(lens) == 31 and lens[0].shape == (1, 49152)
    np.testing.assert_array_equal(lens[-1], step.logits)               # the last layer's is the model's prediction
    _, states, _ = run_transformers(hf_smollm, ids[None])
    with torch.no_grad():
        theirs = [hf_smollm.lm_head(hf_smollm.model.norm(torch.from_numpy(states[i][:, -1]))).numpy()
                  for i in (1, 12, 29)]
    assert max_difference([lens[i] for i in (1, 12, 29)], theirs) <= BOUNDS[np.float32]["logits"]


# --- the model and its arguments -----------------------------------------------------------------------------------

def test_the_packaged_file_is_smollm2_135m_instruct(smollm):
    assert smollm.config == LlamaConfig(n_layers=30, n_heads=9, n_kv_heads=3, d_model=576, d_ff=1536,
                                        vocab_size=49152, max_positions=8192, rope_base=100000.0,
                                        rms_norm_eps=np.float32(1e-5).item())
    assert smollm.config.d_k == 64 and smollm.config.group == 3
    assert (smollm.architecture, smollm.quantization, smollm.license, smollm.causal) == \
        ("LlamaForCausalLM", "Q4_1", "apache-2.0", True)
    layer = smollm.llama.layers[0]
    assert layer.w_qkv.shape == (576, 960) and layer.w_gate_up.shape == (576, 3072)   # (d_in, d_out)
    assert smollm.llama.unembedding.shape == (576, 49152)
    assert all(not a.flags.writeable and a.dtype == np.float32 for a in [*layer.arrays(), smollm.llama.unembedding])
    assert 500 << 20 < smollm.llama.nbytes < 520 << 20


@pytest.mark.parametrize(("call", "argument", "message"), [
    (lambda m: m(np.zeros((1, 8193), np.int64)), "token_ids", "8193 positions; the model has 8192"),
    (lambda m: m(np.array([[1, 49152]])), "token_ids", r"ids must be in \[0, 49152\)"),
    (lambda m: m(np.array([[1, -1]])), "token_ids", r"ids must be in \[0, 49152\)"),
    (lambda m: m(np.zeros((1, 0), np.int64)), "token_ids", "B and n >= 1"),
    (lambda m: m(np.zeros((0, 3), np.int64)), "token_ids", "B and n >= 1"),
    (lambda m: m(np.array([[1.0, 2.0]])), "token_ids", "integers"),
    (lambda m: m(np.array([1, 2])), "token_ids", r"\(B, n\)"),
    (lambda m: m(np.array([[1, 2]]), np.array([3])), "lengths", r"in \[1, 2\]"),
    (lambda m: m(np.array([[1, 2]]), np.array([0])), "lengths", r"in \[1, 2\]"),
    (lambda m: m(np.array([[1, 2]]), dtype=np.float16), "dtype", "float32 or float64"),
    (lambda m: m(np.array([[1, 2]]), logits="first"), "logits", "expected one of"),
    (lambda m: m(np.array([[1, 2]]), heads=[9]), "heads", r"\[0, 9\)"),
    (lambda m: m(np.array([[1, 2]]), weights_of=[30]), "weights_of", r"\[0, 30\)"),
    (lambda m: m.trace(np.array([[1, 2]]), layers=[-1]), "layers", r"\[0, 30\)"),
    (lambda m: m(np.array([[1, 2]]), cache=m.new_cache(batch=2)), "token_ids", "the cache holds 2"),
    (lambda m: m(np.array([[1, 2]]), cache=m.new_cache(), dtype=np.float64), "dtype", "the cache's float32"),
    (lambda m: m(np.array([[1, 2]]), np.array([2]), cache=m.new_cache()), "lengths", "not kept in a cache"),
    (lambda m: m.step(m.new_cache(), np.array([[1]])), "token_ids", "one token per sequence"),
])
def test_what_the_model_cannot_compute_is_refused_by_argument(smollm, call, argument, message):
    with pytest.raises(AttentionError, match=message) as caught:
        call(smollm.llama)
    assert caught.value.argument == argument


def test_a_cache_cannot_pass_the_models_positions(smollm):
    cache = smollm.llama.new_cache(capacity=8)
    cache.length = 8190                                                # as if 8190 positions had been computed
    with pytest.raises(AttentionError, match="8193 positions"):
        smollm.llama(np.ones((1, 3), np.int64), cache=cache)
    assert cache.length == 8190 and cache.capacity == 8                # refused before anything changed
