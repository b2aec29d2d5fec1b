"""attention/generation.py on the real decoder: each step's attention row and logit lens against the whole
sequence's forward pass, sampling through the cache against recomputing, the finish reasons, and the text given out
piece by piece (TextSoFar: cut characters and stop strings held back). The greedy tokens against transformers'
``generate`` are in test_llama.py."""

from __future__ import annotations

import numpy as np
import pytest

from attention import AttentionError
from attention.generation import LENS_TOP, Generation, GenerationOptions, TextSoFar
from attention.sampling import Sampler, Sampling, log_softmax

CHAT = [{"role": "user", "content": "What is the capital of France?"}]

pytestmark = pytest.mark.usefixtures("one_thread_each")


GREEDY = Sampling()


def run(smollm, prompt, options: GenerationOptions, sampling: Sampling = GREEDY, seed: int = 0):
    ids = smollm.tokenizer.encode_chat(prompt).ids if isinstance(prompt, list) else smollm.tokenizer.encode(prompt).ids
    generation = Generation(smollm.llama, smollm.tokenizer, ids, options, Sampler(sampling, seed))
    return ids, generation, list(generation)


def test_each_steps_row_and_lens_are_the_whole_sequences(smollm):
    """A step's attention is its token's own row (the query) in the forward pass over prompt + generated tokens;
    its lens is every layer's prediction at the position before it, the last row the candidates it was drawn from."""
    layers, heads = (0, 13, 29), (8, 0)
    ids, _, steps = run(smollm, CHAT, GenerationOptions(6, layers=layers, heads=heads, logit_lens=True,
                                                                 top_logprobs=LENS_TOP))
    sequence = np.concatenate([ids, [step.token for step in steps]])
    whole = smollm.llama(sequence[None], weights_of=layers, heads=heads, hidden_states=True, logits="all")
    lens = [log_softmax(rows) for rows in smollm.llama.logit_lens([s[0] for s in whole.hidden_states])]
    for step in steps:
        position = ids.size + step.index
        for layer, row in zip(layers, step.attention, strict=True):
            assert row.shape == (len(heads), position + 1)
            assert np.abs(row - whole.weights[layer][0, :, position, :position + 1]).max() <= 1e-5
        by_layer = np.stack([rows[position - 1] for rows in lens])                 # (L + 1, vocab)
        assert step.lens.ids.shape == (smollm.config.n_layers + 1, LENS_TOP)
        assert np.abs(step.lens.logprobs - np.take_along_axis(by_layer, step.lens.ids, 1)).max() <= 1e-4
        assert step.lens.ids[-1].tolist() == step.choice.top.tolist()              # the last layer: the model's own
        assert (np.diff(step.lens.logprobs, axis=1) <= 0).all()


def test_sampling_through_the_cache_equals_recomputing_each_step(smollm):
    sampling = Sampling(0.9, 40, 0.95)
    ids, generation, steps = run(smollm, "Once upon a time", GenerationOptions(12), sampling, seed=2026)
    replay, sequence = Sampler(sampling, 2026), list(ids)
    for step in steps:
        logits = smollm.llama(np.array([sequence]), logits="last").logits[0]
        choice = replay.choose(logits, 5)
        assert choice.token == step.token and choice.kept == step.choice.kept
        assert abs(choice.logprob - step.choice.logprob) <= 1e-4
        sequence.append(choice.token)
    again = run(smollm, "Once upon a time", GenerationOptions(12), sampling, seed=2026)[2]
    assert [s.token for s in again] == [s.token for s in steps] and generation.finish_reason == "length"


def test_a_chat_ends_at_the_end_of_text_token_which_is_no_text(smollm):
    _, generation, steps = run(smollm, CHAT, GenerationOptions(32))
    assert generation.finish_reason == "stop" and steps[-1].token == smollm.tokenizer.eos_id
    assert generation.text == "The capital of France is Paris." == "".join(step.text for step in steps)
    assert steps[-1].bytes == b"<|im_end|>" and steps[-1].text == ""
    assert generation.steps == len(steps) == 8


def test_a_stop_string_ends_the_text_before_it(smollm):
    _, generation, steps = run(smollm, CHAT, GenerationOptions(32, stop=("never", " Paris")))
    assert generation.finish_reason == "stop_sequence" and generation.text == "The capital of France is"
    assert "".join(step.text for step in steps) == generation.text
    assert smollm.tokenizer.decode([steps[-1].token]) == " Paris"


def test_the_budget_ends_it_and_a_consumer_may_stop_early(smollm):
    ids, generation, steps = run(smollm, "The animal didn't cross the street because", GenerationOptions(3))
    assert (len(steps), generation.finish_reason) == (3, "length")
    generation = Generation(smollm.llama, smollm.tokenizer, ids, GenerationOptions(10), Sampler(Sampling()))
    for step in generation:
        if step.index == 1:
            break
    assert (generation.steps, generation.finish_reason) == (2, None)


def test_what_cannot_be_generated_is_refused_by_argument(smollm):
    tokenizer, llama = smollm.tokenizer, smollm.llama
    for prompt, options, argument in [
            (np.array([], np.int64), GenerationOptions(1), "prompt"),
            (np.array([1, 2]), GenerationOptions(0), "max_new_tokens"),
            (np.array([1, 2]), GenerationOptions(smollm.config.max_positions - 1), "max_new_tokens")]:
        with pytest.raises(AttentionError) as refused:
            Generation(llama, tokenizer, prompt, options, Sampler(Sampling()))
        assert refused.value.argument == argument


# --- the text, piece by piece ---------------------------------------------------------------------------------------

def given(pieces: list[bytes], stop: tuple[str, ...] = ()) -> tuple[list[str], TextSoFar]:
    text = TextSoFar(stop)
    out = [text.add(piece) for piece in pieces]
    out.append(text.finish())
    return out, text


def test_a_character_cut_between_tokens_waits_for_its_last_byte():
    robot = "🤖".encode()                                                        # four bytes
    out, text = given([b"a " + robot[:1], robot[1:3], robot[3:] + b"!"])
    assert out == ["a ", "", "🤖!", ""] and text.text == "a 🤖!"


def test_a_cut_character_at_the_end_and_invalid_bytes_become_replacement_characters():
    out, text = given([b"ok \xff x", "é".encode()[:1]])
    assert "".join(out) == text.text == "ok \ufffd x\ufffd"


def test_a_possible_stop_string_is_held_back_until_it_is_not_one():
    out, text = given([b"The cap", b"ital ", b"of", b" France"], stop=("of F",))
    assert out == ["The cap", "ital ", "", "", ""] and text.text == "The capital " and text.stopped
    out, text = given([b"x o", b"f G"], stop=("of F",))
    assert out == ["x ", "of G", ""] and not text.stopped


def test_the_earliest_stop_string_wins_and_nothing_follows_it():
    out, text = given([b"one, two. three", b" four"], stop=(".", ","))
    assert out == ["one", "", ""] and text.text == "one"
