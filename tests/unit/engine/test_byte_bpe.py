"""attention/byte_bpe.py on the real SmolLM2 file: ids equal to transformers' tokenizer (read from the same file)
where its GPT-2 pre-tokenizer and the file's ``smollm`` rule agree, and to the ``smollm`` rule's definition where
they do not; every text decoded back to itself; tokens shown as text and bytes; the chat template rendered as
transformers renders it, in Jinja's sandbox; the messages it refuses."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from attention import AttentionError, ByteBPE

# Texts on which both pre-tokenizers cut alike: no run of white space before a numeral, no space before a numeral
# that is not an ASCII digit (SmolLM2's merges join no digits, so "2024" is four tokens either way).
AGREE = [
    "The animal didn't cross the street because it was too tired.",
    "Hello world", " Hello", "  two leading spaces", "trailing spaces   ", "",
    "Crème brûlée à Zürich, 東京タワー 🤖🎉 and \x00\x07 bells\ttabs\u200b",
    "In 2024 the price was 3.14 or 1,000,000 (about 42%).",
    "def f(x):\n    return x ** 2  # squares\n\n\tindented\r\nwindows line",
    "I'm sure they'll say we've done it; you'd agree? YES!!! ...",
    "<|im_start|>user\nHi<|im_end|>\n",                   # control tokens spelled out are matched whole
    "naïve café, Ελληνικά, русский, עברית, العربية, हिन्दी",
    "x²³+½¾=٣٤١٢(１２３)",
]
# Texts on which they do not: a run of white space before a numeral (GPT-2 gives the numeral the last of it), a
# space before a numeral that is not an ASCII digit (GPT-2 keeps them together, and the merges join " ٣" and " Ⅳ";
# the merges join no space to an ASCII digit). Numerals alone ("x²³", "٣٤", "½¾") come out alike.
DIFFER = ["a   1", "x  42 and  7", "x\t\t5", "x\n\n5", "   9", "٣٤ and ١٢", "Ⅻ Ⅳ"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Name three primes."},
     {"role": "assistant", "content": "2, 3 and 5."}, {"role": "user", "content": "And the next one?"}],
    [{"role": "user", "content": "Crème brûlée 🤖 in 2024?\n\nTwo lines."}],
]


def smollm_rule(hf_tokenizer, text: str) -> list[int]:
    """The ``smollm`` rule by its definition: cut before and after every numeral (Unicode category N, as ``\\p{N}``),
    then GPT-2's rule on each piece, which is what transformers' tokenizer does to a piece alone."""
    pieces, current = [], ""
    for character in text:
        if unicodedata.category(character).startswith("N"):
            pieces += [current, character] if current else [character]
            current = ""
        else:
            current += character
    pieces += [current] if current else []
    return [i for piece in pieces for i in hf_tokenizer(piece, add_special_tokens=False)["input_ids"]]


@pytest.mark.parametrize("text", AGREE)
def test_ids_equal_transformers_where_the_two_rules_agree(smollm, hf_smollm_tokenizer, text):
    ours = smollm.tokenizer.encode(text)
    assert ours.ids.tolist() == hf_smollm_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ours.ids.tolist() == smollm_rule(hf_smollm_tokenizer, text)
    assert ours.ids.dtype == np.int64 and len(ours.tokens) == len(ours.bytes) == len(ours.special) == len(ours.ids)


@pytest.mark.parametrize("text", DIFFER)
def test_ids_follow_the_smollm_rule_where_transformers_falls_back_to_gpt2(smollm, hf_smollm_tokenizer, text):
    ours = smollm.tokenizer.encode(text).ids.tolist()
    assert ours == smollm_rule(hf_smollm_tokenizer, text)
    assert ours != hf_smollm_tokenizer(text, add_special_tokens=False)["input_ids"]   # the case is a real one


@pytest.mark.parametrize("text", AGREE + DIFFER)
def test_every_text_decodes_back_to_itself_and_its_bytes_join_to_it(smollm, text):
    encoded = smollm.tokenizer.encode(text)
    assert smollm.tokenizer.decode(encoded.ids) == text
    assert b"".join(encoded.bytes) == text.encode()


def test_tokens_show_their_text_and_bytes_and_a_cut_character_as_u_fffd(smollm):
    encoded = smollm.tokenizer.encode(" 🤖 hi<|im_end|>")
    assert encoded.bytes == [b" \xf0\x9f", b"\xa4", b"\x96", b" hi", b"<|im_end|>"]    # the robot is 3 tokens
    assert encoded.tokens == [" \ufffd", "\ufffd", "\ufffd", " hi", "<|im_end|>"]
    assert encoded.special.tolist() == [False, False, False, False, True]
    again = smollm.tokenizer.tokenized(encoded.ids.tolist())
    assert (again.tokens, again.bytes, again.ids.tolist(), again.special.tolist()) == \
        (encoded.tokens, encoded.bytes, encoded.ids.tolist(), encoded.special.tolist())


def test_the_file_adds_no_bos_and_ends_turns_with_im_end(smollm):
    tokenizer = smollm.tokenizer
    assert tokenizer.encode("Hello").ids.tolist() == [19556]              # nothing added before or after
    assert tokenizer.eos_id == 2 and tokenizer.token_bytes(2) == b"<|im_end|>"
    assert tokenizer.vocab_size == 49152


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_the_chat_template_renders_as_transformers_apply_chat_template(smollm, hf_smollm_tokenizer, messages):
    text = hf_smollm_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert smollm.tokenizer.render_chat(messages) == text
    assert text.endswith("<|im_start|>assistant\n")
    encoded = smollm.tokenizer.encode_chat(messages)
    assert encoded.ids.tolist() == smollm.tokenizer.encode(text).ids.tolist()
    assert encoded.ids.tolist() == hf_smollm_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert encoded.ids[0] == 1 and encoded.special.sum() == 2 * (len(messages) + (messages[0]["role"] != "system")) + 1


@pytest.mark.parametrize(("messages", "argument"), [
    ([], "messages"),
    ("hi", "messages"),
    ([{"role": "user"}], "messages/0"),
    ([{"role": "user", "content": "hi"}, {"role": 1, "content": "hi"}], "messages/1"),
    ([{"role": "user", "content": ["a", "list"]}], "messages/0"),
    (["hi"], "messages/0"),
])
def test_messages_that_are_not_role_and_content_strings_are_refused(smollm, messages, argument):
    with pytest.raises(AttentionError) as caught:
        smollm.tokenizer.encode_chat(messages)
    assert caught.value.argument == argument


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__ }}",                   # no reaching Python's internals
    "{{ messages.append(messages[0]) }}",                 # nor changing the arguments (the immutable sandbox)
    "{{ raise_exception('no system prompt, please') }}",  # transformers' helper for a template's own refusals
])
def test_the_template_runs_sandboxed_and_its_refusals_name_the_messages(template):
    tokenizer = ByteBPE(["a", "b", "ab", "<|im_end|>"], [1, 1, 1, 3], ["a b"], "smollm", template, {"eos": 3})
    with pytest.raises(AttentionError, match="the chat template refused them") as caught:
        tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert caught.value.argument == "messages"


@pytest.mark.parametrize(("call", "argument"), [
    (lambda t: t.encode(b"bytes"), "text"),
    (lambda t: t.encode(None), "text"),
    (lambda t: t.decode([49152]), "ids"),
    (lambda t: t.decode([-1]), "ids"),
])
def test_what_the_tokenizer_cannot_read_is_refused_by_argument(smollm, call, argument):
    with pytest.raises(AttentionError) as caught:
        call(smollm.tokenizer)
    assert caught.value.argument == argument
