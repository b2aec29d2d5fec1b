"""attention/interventions.py: head knockout and token occlusion against their definitions computed independently
(tests/unit/engine/interventions_reference.py): transformers' modules with a head's context zeroed by a forward
hook, plain loops of one run per knockout or occlusion; knocking out or occluding nothing changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from attention import AttentionError, interventions
from attention.decoder_blocks import grouped_causal_mask, rms_norm, rotary_angles
from attention.interventions import (
    chosen_heads,
    decoder_knockout,
    decoder_occlusion,
    encoder_knockout,
    encoder_occlusion,
    head_table,
    next_token_shift,
    occludable,
    removed_copies,
)
from tests.unit.engine.interventions_reference import (
    kl_by_definition,
    knocked_by_hook,
    plain_run,
    shift_by_loops,
)

pytestmark = pytest.mark.usefixtures("one_thread_each")

SENTENCE = "The animal didn't cross the street, because it was too tired."
SHORT = "The cat sat on the mat."
DTYPES = [np.float32, np.float64]
# Agreement with transformers (absolute, last hidden states of magnitude <= ~6): float32 measured at most 3.0e-6
# over MiniLM's 72 knockouts of two texts, float64 5.9e-15. The decoder's stacked runs against its plain loop: 1.1e-6
# (float32) and 2.0e-15 (float64) of the largest logit; knocking out or occluding nothing: exactly 0.
STATES = {np.float32: 1e-5, np.float64: 1e-10}
NOTHING = {np.float32: 1e-6, np.float64: 1e-12}


def stacked_loop(stages, x: np.ndarray, layer: int, head: int) -> np.ndarray:
    """One knockout the plain way: every layer in turn on x (1, n, d_model), head ``head``'s context zeroed in layer
    ``layer`` -> the last hidden state (1, n, d_model)."""
    for index, stage in enumerate(stages):
        contexts = stage.attend(x)
        if index == layer:
            contexts[:, head] = 0
        x = stage.finish(x, contexts)
    return x


# --- head knockout: MiniLM -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_minilm_knockout_equals_transformers_with_the_head_zeroed_by_a_hook(minilm, hf_bert, dtype):
    ids = minilm.tokenizer.encode(SENTENCE).ids
    model = hf_bert[dtype]
    knock = [(layer, head) for layer in range(6) for head in range(12)]
    if dtype == np.float64:
        knock = [(0, 0), (0, 11), (2, 5), (5, 7), (5, 11), (3, 3)]         # out of order: answers in knock's
    states = minilm.bert.knockout(ids[None], knock=knock, dtype=dtype)      # (1 + K, n, d_model)
    shift = encoder_knockout(minilm.bert, ids, knock=knock, dtype=dtype)
    assert states.shape == (1 + len(knock), len(ids), 384) and states.dtype == dtype
    assert shift.cosine_distance.shape == (len(knock),) and shift.largest_change.dtype == dtype
    full = plain_run(model, ids[None])
    assert np.abs(states[0] - full).max() <= STATES[dtype]
    for k, (layer, head) in enumerate(knock):
        dense = model.encoder.layer[layer].attention.output.dense
        theirs = knocked_by_hook(model, dense, ids[None], head, 32)
        assert np.abs(states[1 + k] - theirs).max() <= STATES[dtype], (layer, head)
        if k % 7 == 0 or dtype == np.float64:                              # the measures, by loops, on some
            distance, largest = shift_by_loops(full, theirs)
            assert abs(shift.cosine_distance[k] - distance) <= 1e-6
            assert abs(shift.largest_change[k] - largest) <= STATES[dtype] * 10
    assert shift.cosine_distance.min() > 0


# --- head knockout: the decoder --------------------------------------------------------------------------------------

DECODER_KNOCK = [(29, 4), (0, 0), (0, 8), (7, 2), (15, 6), (29, 0)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_decoder_knockout_equals_a_plain_loop_of_single_runs(smollm, monkeypatch, dtype):
    """Every knockout against its own run through the same layers, one at a time; chunks of two knockouts (each its
    own pass), so the chunking is exercised."""
    llama = smollm.llama
    ids = smollm.tokenizer.encode(SHORT).ids[None]
    monkeypatch.setattr(interventions, "STACKED_ROWS", 2 * ids.shape[1])
    logits = llama.knockout(ids, DECODER_KNOCK, dtype=dtype)                # (1 + K, vocab)
    stages = decoder_stages(llama, ids.shape[1], np.dtype(dtype))
    x = llama.embed(ids, np.dtype(dtype))
    plain = llama(ids, dtype=dtype, return_weights=False).logits[0]
    assert np.abs(logits[0] - plain).max() <= NOTHING[dtype] * np.abs(plain).max()
    for k, (layer, head) in enumerate(DECODER_KNOCK):
        last = stacked_loop(stages, x, layer, head)[0, -1]                   # (d_model,)
        theirs = llama.unembed(rms_norm(last, llama.final_norm.astype(dtype), llama.config.rms_norm_eps), last.dtype)
        bound = (1e-4 if dtype == np.float32 else 1e-12) * np.abs(theirs).max()
        assert np.abs(logits[1 + k] - theirs).max() <= bound, (layer, head)


def decoder_stages(llama, n: int, dtype: np.dtype) -> list:
    """The decoder's layers split before W_O (its own forward's stages) for an uncached prompt of n tokens."""
    rotation = rotary_angles(np.arange(n), llama.config.d_k, llama.config.rope_base, dtype)
    return [llama._stages(layer, rotation, grouped_causal_mask(n, 0, llama.config.group)) for layer in llama.layers]


def test_decoder_knockout_equals_transformers_with_the_head_zeroed_by_a_hook(smollm, hf_smollm):
    ids = smollm.tokenizer.encode(SHORT).ids
    shift = decoder_knockout(smollm.llama, ids, DECODER_KNOCK)
    full = plain_run(hf_smollm, ids[None])[-1]
    assert shift.full_top == int(full.argmax())
    for k, (layer, head) in enumerate(DECODER_KNOCK):
        theirs = knocked_by_hook(hf_smollm, hf_smollm.model.layers[layer].self_attn.o_proj, ids[None], head, 64)[-1]
        assert abs(shift.kl[k] - kl_by_definition(full, theirs)) <= 2e-5, (layer, head)
        assert shift.top[k] == int(theirs.argmax())


# --- knocking out and occluding nothing ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_knocking_out_nothing_changes_nothing(minilm, smollm, dtype):
    ids = minilm.tokenizer.encode(SENTENCE).ids[None]
    states = minilm.bert.knockout(ids, knock=[], dtype=dtype)
    plain = minilm.bert(ids, dtype=dtype).output
    assert states.shape == plain.shape and np.abs(states - plain).max() <= NOTHING[dtype]
    assert encoder_knockout(minilm.bert, ids[0], knock=[], dtype=dtype).cosine_distance.shape == (0,)
    prompt = smollm.tokenizer.encode(SHORT).ids[None]
    logits = smollm.llama.knockout(prompt, [], dtype=dtype)
    plain = smollm.llama(prompt, dtype=dtype).logits
    assert np.abs(logits - plain).max() <= NOTHING[dtype] * np.abs(plain).max()
    assert decoder_knockout(smollm.llama, prompt[0], [], dtype=dtype).kl.shape == (0,)


@pytest.mark.parametrize("dtype", DTYPES)
def test_occluding_nothing_changes_nothing(minilm, smollm, dtype):
    """No position: no run. A [MASK] replaced by [MASK]: a stacked run of the very input, which moves nothing."""
    encoded = minilm.tokenizer.encode("The cat [MASK] on the mat.")
    mask_id = encoded.ids[3]
    assert encoded.tokens[3] == "[MASK]"
    nothing = encoder_occlusion(minilm.bert, encoded.ids, [], mask_id, dtype=dtype)
    assert nothing.cosine_distance.shape == nothing.largest_change.shape == (0,)
    same = encoder_occlusion(minilm.bert, encoded.ids, [3, 2], mask_id, dtype=dtype)
    assert same.cosine_distance[0] <= NOTHING[dtype] and same.largest_change[0] <= NOTHING[dtype] * 10
    assert same.cosine_distance[1] > 1e-4                                  # "cat" masked does move it
    prompt = smollm.tokenizer.encode(SHORT).ids
    assert decoder_occlusion(smollm.llama, prompt, [], dtype=dtype).kl.shape == (0,)


# --- token occlusion -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_encoder_occlusion_equals_runs_of_the_masked_input(minilm, dtype):
    encoded = minilm.tokenizer.encode(SHORT, "It was tired.")
    mask_id = minilm.tokenizer.token_id("[MASK]")
    positions = occludable(encoded.special)
    assert len(positions) == len(encoded.ids) - 3                          # [CLS], [SEP], [SEP] left alone
    shift = encoder_occlusion(minilm.bert, encoded.ids, positions, mask_id, encoded.type_ids, dtype=dtype)
    full = minilm.bert(encoded.ids[None], encoded.type_ids[None], dtype=dtype).output[0]
    for k, position in enumerate(positions):
        ids = encoded.ids.copy()
        ids[position] = mask_id
        run = minilm.bert(ids[None], encoded.type_ids[None], dtype=dtype).output[0]
        distance, largest = shift_by_loops(full, run)
        assert abs(shift.cosine_distance[k] - distance) <= NOTHING[dtype] * 10
        assert abs(shift.largest_change[k] - largest) <= STATES[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_decoder_occlusion_equals_runs_of_the_shortened_prompt(smollm, monkeypatch, dtype):
    ids = smollm.tokenizer.encode(SHORT).ids
    monkeypatch.setattr(interventions, "STACKED_ROWS", 3 * len(ids))      # chunks of 3 prompts
    shift = decoder_occlusion(smollm.llama, ids, dtype=dtype)
    assert shift.kl.shape == (len(ids) - 1,)                                # every token but the last
    full = smollm.llama(ids[None], dtype=dtype).logits[0]
    for position in range(len(ids) - 1):
        shorter = np.delete(ids, position)
        run = smollm.llama(shorter[None], dtype=dtype).logits[0]
        assert abs(shift.kl[position] - kl_by_definition(full, run)) <= (2e-5 if dtype == np.float32 else 1e-10)
        assert shift.top[position] == int(run.argmax())
    chosen = decoder_occlusion(smollm.llama, ids, [4, 1], dtype=dtype)     # the service's positions, its order
    np.testing.assert_allclose(chosen.kl, shift.kl[[4, 1]], rtol=1e-4 if dtype == np.float32 else 1e-12)


def test_decoder_occlusion_under_a_chat_template_removes_only_the_users_text(smollm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where did the cat sit?"}]
    prompt = smollm.tokenizer.encode_chat(messages)
    positions = smollm.tokenizer.chat_positions(messages)
    assert smollm.tokenizer.decode(prompt.ids[positions]) == "Where did the cat sit?"
    assert smollm.tokenizer.decode(prompt.ids[smollm.tokenizer.chat_positions(messages, ("system",))]) == "Be brief."
    shift = decoder_occlusion(smollm.llama, prompt.ids, positions)
    assert shift.kl.shape == (len(positions),) and (shift.kl > 0).all()


def test_head_table_places_each_value_and_leaves_the_rest_null():
    table = head_table(chosen_heads([[1, 2], [0, 0]], 2, 3), np.array([0.5, 0.25]), 2, 3)
    np.testing.assert_array_equal(table, [[0.25, np.nan, np.nan], [np.nan, np.nan, 0.5]])
    assert head_table(chosen_heads(None, 2, 3), np.arange(6.0), 2, 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert np.isnan(head_table([], np.zeros(0), 1, 2)).all()


def test_removed_copies_shift_the_later_tokens_up():
    np.testing.assert_array_equal(removed_copies(np.array([10, 11, 12, 13]), np.array([0, 2])),
                                  [[11, 12, 13], [10, 11, 13]])


def test_next_token_shift_by_hand():
    """Two tokens: p = (1/2, 1/2) against q = (1/4, 3/4): KL = 1/2 log 2 + 1/2 log(2/3)."""
    shift = next_token_shift(np.zeros(2), np.log(np.array([[0.25, 0.75], [0.5, 0.5]])))
    np.testing.assert_allclose(shift.kl, [0.5 * np.log(2) + 0.5 * np.log(2 / 3), 0], atol=1e-15)
    assert shift.full_top == 0 and shift.top_changed.tolist() == [True, False]


# --- arguments -------------------------------------------------------------------------------------------------------

def test_what_cannot_be_knocked_out_or_occluded_is_refused_by_argument(minilm, smollm):
    ids = minilm.tokenizer.encode(SHORT).ids
    for call, argument in [
        (lambda: minilm.bert.knockout(ids[None], knock=[(6, 0)]), "knock/0"),
        (lambda: minilm.bert.knockout(ids[None], knock=[(0, 1), (0, 12)]), "knock/1"),
        (lambda: minilm.bert.knockout(ids[None], knock=[(0,)]), "knock/0"),
        (lambda: minilm.bert.knockout(ids[None], knock=[(0, True)]), "knock/0"),
        (lambda: minilm.bert.knockout(np.stack([ids, ids])), "token_ids"),
        (lambda: smollm.llama.knockout(ids[None], [(30, 0)]), "knock/0"),
        (lambda: smollm.llama.knockout(np.stack([ids, ids])), "token_ids"),
        (lambda: encoder_occlusion(minilm.bert, ids, [len(ids)], 103), "positions"),
        (lambda: encoder_occlusion(minilm.bert, ids, [1, 1], 103), "positions"),
        (lambda: decoder_occlusion(smollm.llama, ids, [len(ids) - 1]), "positions"),   # the last token stays
    ]:
        with pytest.raises(AttentionError) as caught:
            call()
        assert caught.value.argument == argument
