"""A GGUF file's byte-level BPE tokenizer and chat template, as the decoder reads text.

Byte-level BPE (GPT-2's): the text is UTF-8 bytes, each byte spelled as one printable character (a space is
"Ġ"), and the learned merges join frequent neighbours into tokens. A token may so end inside a multi-byte
character: 🤖 is three tokens here. Before the merges, a pre-tokenizer cuts the text into pieces that no
token crosses; the file names its rule in ``tokenizer.ggml.pre``. SmolLM2's is llama.cpp's ``smollm``: every
numeral alone (``\\p{N}``), then GPT-2's rule (contractions, words with their leading space, numbers,
punctuation runs, spaces). transformers' GGUF loader has no ``smollm`` entry and falls back to GPT-2's rule,
which keeps a space before a digit and runs of numerals together; the two rules differ only there.

The tokenizer is Hugging Face ``tokenizers`` (what transformers runs) built from the file's vocabulary and
merges; the control tokens (``<|im_start|>``, ``<|im_end|>``, ...) are matched whole in the text, as
transformers does. The chat template is the file's own Jinja template, rendered in Jinja's immutable sandbox
(a template cannot reach Python's internals nor change its arguments) with transformers' settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import jinja2
import jinja2.ext
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from .errors import AttentionError

CONTROL = 3  # tokenizer.ggml.token_type of a control token (llama.cpp's LLAMA_TOKEN_TYPE_CONTROL)
# The file's pre-tokenizer name -> the regex that cuts before GPT-2's rule (llama.cpp's llama-vocab.cpp).
PRE_TOKENIZERS = {"smollm": r"\p{N}"}


@dataclass(frozen=True)
class TokenizedText:
    """A text as the decoder reads it: each token's text for display (its bytes decoded alone, U+FFFD where it
    holds part of a character), its id, its raw bytes, and whether it is a control token."""

    tokens: list[str]
    ids: np.ndarray        # (n,) int64
    bytes: list[bytes]
    special: np.ndarray    # (n,) bool


class ByteBPE:
    """The tokenizer of a GGUF file: ``tokens`` (its vocabulary, byte-level spelled), ``token_types`` (one per
    token), ``merges`` ("a b" each), its pre-tokenizer's name, its chat template (Jinja source, or None) and its
    special tokens' ids by role (``{"eos": 2, "bos": 1, ...}``; "eos" is required). ``ValueError`` naming what is
    wrong: an unknown pre-tokenizer, a template that does not compile."""

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str], pre: str,
                 chat_template: str | None, specials: Mapping[str, int]) -> None:
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"tokenizer.ggml.pre: {pre!r} is not a pre-tokenizer the engine knows "
                             f"({', '.join(PRE_TOKENIZERS)})")
        self._tokens = list(tokens)
        self._control = frozenset(i for i, kind in enumerate(token_types) if kind == CONTROL)
        bpe = models.BPE(vocab={token: i for i, token in enumerate(self._tokens)},
                         merges=[tuple(merge.split(" ", 1)) for merge in merges],
                         dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
        self._tokenizer = Tokenizer(bpe)
        self._tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre]), behavior="isolated"),  # numerals one by one
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),         # then GPT-2's rule
        ])
        self._tokenizer.decoder = decoders.ByteLevel()
        self._tokenizer.add_special_tokens([AddedToken(self._tokens[i], special=True, normalized=False)
                                            for i in sorted(self._control)])
        self.eos_id = specials["eos"]
        # The template sees them as transformers passes them: bos_token, eos_token, ... by their text.
        self._special_text = {f"{role}_token": self._tokens[i] for role, i in specials.items()}
        self._template = None if chat_template is None else _compile(chat_template)

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode(self, text: str) -> TokenizedText:
        """The text's tokens, no BOS or EOS added (the file's model adds none); control tokens spelled out in the
        text (``<|im_end|>``) are matched whole, as transformers does."""
        if not isinstance(text, str):
            raise AttentionError("text", f"expected a string, got {type(text).__name__}")
        return self.tokenized(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> TokenizedText:
        """``messages`` ([{"role": ..., "content": ...}, ...]) through the file's chat template, with the prompt of
        the assistant's turn added at the end, then :meth:`encode`d."""
        return self.encode(self.render_chat(messages))

    def chat_positions(self, messages: Sequence[Mapping[str, str]], roles: Sequence[str] = ("user",)) -> np.ndarray:
        """The positions (P,) int64 of :meth:`encode_chat`'s tokens that lie inside the content of a message whose
        role is in ``roles``: the text the user typed, without the template's markup (what occlusion of a chat
        prompt removes, token by token). Each content is found in the rendered text after the previous one's; a
        token that straddles a content's edge is not counted."""
        text = self.render_chat(messages)
        inside, cursor = [], 0
        for index, message in enumerate(messages):
            start = text.find(message["content"], cursor)
            if start < 0:
                raise AttentionError(f"messages/{index}", "the chat template does not copy this content as it is")
            cursor = start + len(message["content"])
            if message["role"] in roles:
                inside.append((start, cursor))
        offsets = np.array(self._tokenizer.encode(text, add_special_tokens=False).offsets).reshape(-1, 2)  # (n, 2)
        kept = np.zeros(len(offsets), bool)
        for start, end in inside:
            kept |= (offsets[:, 0] >= start) & (offsets[:, 1] <= end) & (offsets[:, 1] > offsets[:, 0])
        return np.flatnonzero(kept)

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The chat template's text for ``messages`` and the assistant's turn to come, as transformers'
        ``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`` renders it."""
        if self._template is None:
            raise AttentionError("messages", "the model's file has no chat template")
        _check_messages(messages)
        try:
            return self._template.render(messages=[dict(m) for m in messages], add_generation_prompt=True,
                                         **self._special_text)
        except jinja2.TemplateError as exc:
            raise AttentionError("messages", f"the chat template refused them: {exc}") from None

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Token ids -> text, control tokens included (invalid UTF-8 left by a cut character becomes U+FFFD)."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if any(not 0 <= i < len(self._tokens) for i in ids):
            raise AttentionError("ids", f"ids must be in [0, {len(self._tokens)})")
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (a control token: its name in UTF-8)."""
        token = self._tokens[token_id]
        if token_id in self._control:
            return token.encode()
        characters = _byte_of_character()
        return bytes(characters[c] for c in token)

    def tokenized(self, ids: Sequence[int]) -> TokenizedText:
        """:class:`TokenizedText` of token ids."""
        raw = [self.token_bytes(i) for i in ids]
        return TokenizedText([b.decode("utf-8", errors="replace") for b in raw], np.array(ids, dtype=np.int64), raw,
                             np.array([i in self._control for i in ids], dtype=bool))


@cache
def _byte_of_character() -> dict[str, int]:
    """GPT-2's byte-level alphabet backwards: the character that spells each byte -> the byte. Printable Latin-1
    bytes spell themselves; the others (control characters, space, ...) take code points from 256 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


def _compile(source: str) -> jinja2.Template:
    """A chat template compiled in the immutable sandbox, with transformers' settings (blocks trimmed, loop
    controls, ``raise_exception``). ``ValueError`` naming the metadata key if it does not compile."""
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
    environment.globals["raise_exception"] = _raise
    try:
        return environment.from_string(source)
    except jinja2.TemplateError as exc:
        raise ValueError(f"tokenizer.chat_template: does not compile ({exc})") from None


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _check_messages(messages: Sequence[Mapping[str, str]]) -> None:
    if not isinstance(messages, list | tuple) or not messages:
        raise AttentionError("messages", "expected a non-empty list of {role, content}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not all(isinstance(message.get(k), str) for k in ("role", "content")):
            raise AttentionError(f"messages/{i}", "expected {\"role\": str, \"content\": str}")
