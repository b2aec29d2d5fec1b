"""attention: the forward pass of "Attention Is All You Need" in plain numpy.

Softmax, scaled dot-product attention, self- and multi-head attention with the seed
script's random weights, sinusoidal positional encoding, causal and padding masks, the
toy vocabulary, an encoder block and stack, and the seed's five demos as data; and a trained
BERT-family encoder read from a Hugging Face folder (``bert``, ``pretrained``), on the same attention kernel.
The layers and attention functions take leading batch axes; float32 in means float32
throughout, other real inputs are computed in float64.
No training, no web code: the HTTP service imports this, never the other way round.
"""

from .bert import Bert, BertOutput, BertTrace
from .checkpoint import BertConfig
from .demos import DEMOS, Demo
from .encoder import Encoder, EncoderBlock, EncoderLayerTrace, layer_norm
from .errors import AttentionError, UnknownTokenError
from .functional import AttentionTrace, scaled_dot_product_attention, softmax, trace_attention
from .layers import SelfAttention
from .masks import causal_mask, is_per_head, padding_mask
from .multihead import MultiHeadAttention
from .positional import positional_encoding
from .pretrained import Encoded, ModelFolderError, Pretrained, WordPieces, load_folder
from .vocabulary import DIMENSIONS, EMBEDDINGS, embed

__all__ = [
    "DEMOS", "DIMENSIONS", "EMBEDDINGS", "AttentionError", "AttentionTrace", "Bert", "BertConfig", "BertOutput",
    "BertTrace", "Demo", "Encoded", "Encoder",
    "EncoderBlock", "EncoderLayerTrace", "ModelFolderError", "MultiHeadAttention", "Pretrained", "SelfAttention",
    "UnknownTokenError", "WordPieces",
    "causal_mask", "embed", "is_per_head", "layer_norm", "load_folder", "padding_mask", "positional_encoding",
    "scaled_dot_product_attention", "softmax", "trace_attention",
]
