"""attention: the forward pass of "Attention Is All You Need" in plain numpy.

Softmax, scaled dot-product attention, self- and multi-head attention with the seed
script's random weights, sinusoidal positional encoding, causal and padding masks, the
toy vocabulary, an encoder block and stack, and the seed's five demos as data; a trained
BERT-family encoder read from a Hugging Face folder (``bert``, ``pretrained``), and a trained Llama-family
decoder read from a GGUF file (``llama``, ``gguf_model``, ``byte_bpe``: RMSNorm, rotary positions, grouped-query
attention, SwiGLU and a key/value cache in ``decoder_blocks``), both on the same attention kernel; and readings of
any of them beyond raw weights (``analyses``: attention rollout, attention flow, norm-based attention), what a head
or a token matters (``interventions``: head knockout, token occlusion) and where heads look over many texts
(``census``); and generation with the decoder, every step open (``generation``, ``sampling``: greedy or seeded
sampling after temperature, top-k and top-p; each new token's attention row and logit lens).
The layers and attention functions take leading batch axes; float32 in means float32
throughout, other real inputs are computed in float64.
No training, no web code: the HTTP service imports this, never the other way round.
"""

from .analyses import AttentionNorms, attention_norms, flow, mixed_with_residual, rollout, transformed_values
from .bert import Bert, BertOutput, BertTrace
from .byte_bpe import ByteBPE, TokenizedText
from .census import Census, head_census, punctuation_marks
from .checkpoint import BertConfig
from .demos import DEMOS, Demo
from .encoder import Encoder, EncoderBlock, EncoderLayerTrace, EncoderOutput, layer_norm
from .errors import AttentionError, UnknownTokenError
from .functional import AttentionTrace, scaled_dot_product_attention, softmax, trace_attention
from .generation import Generation, GenerationOptions, Step, TextSoFar
from .gguf_model import Decoder, ModelFileError, load_gguf, packaged_gguf, trim_heap
from .interventions import (
    EncoderShift,
    NextTokenShift,
    decoder_knockout,
    decoder_occlusion,
    encoder_knockout,
    encoder_occlusion,
    head_table,
    occludable,
)
from .layers import SelfAttention
from .llama import (
    DecoderLayerTrace,
    DecoderLayerWeights,
    DecoderOutput,
    DecoderTrace,
    KVCache,
    Llama,
    LlamaConfig,
    StepOutput,
)
from .masks import causal_mask, is_per_head, padding_mask
from .multihead import MultiHeadAttention
from .positional import positional_encoding
from .pretrained import Encoded, ModelFolderError, Pretrained, WordPieces, load_folder
from .sampling import Choice, Sampler, Sampling
from .vocabulary import DIMENSIONS, EMBEDDINGS, embed

__all__ = [
    "DEMOS", "DIMENSIONS", "EMBEDDINGS", "AttentionError", "AttentionNorms", "AttentionTrace", "Bert", "BertConfig",
    "BertOutput", "BertTrace", "ByteBPE", "Census", "Choice", "Decoder", "DecoderLayerTrace",
    "DecoderLayerWeights", "DecoderOutput", "DecoderTrace", "Demo", "Encoded", "Encoder", "EncoderBlock",
    "EncoderLayerTrace", "EncoderOutput", "EncoderShift", "Generation", "GenerationOptions", "KVCache", "Llama",
    "LlamaConfig", "ModelFileError", "ModelFolderError", "MultiHeadAttention", "NextTokenShift", "Pretrained",
    "Sampler", "Sampling", "SelfAttention", "Step", "StepOutput", "TextSoFar", "TokenizedText", "UnknownTokenError",
    "WordPieces",
    "attention_norms", "causal_mask", "decoder_knockout", "decoder_occlusion", "embed", "encoder_knockout",
    "encoder_occlusion", "flow", "head_census", "head_table", "is_per_head", "layer_norm", "load_folder", "load_gguf",
    "mixed_with_residual", "occludable", "packaged_gguf", "padding_mask", "positional_encoding", "punctuation_marks",
    "rollout", "scaled_dot_product_attention", "softmax", "trace_attention", "transformed_values", "trim_heap",
]
