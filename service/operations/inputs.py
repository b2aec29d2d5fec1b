"""A request's inputs made ready for the engine: the prepared request, precision, the toy sentence, and the engine
call's errors.

Shared by the operation families (attention, layers, reference, pretrained). A request is prepared once
(:class:`Prepared`): sized and checked against the limits (service.operations.sizes) before any compute, with what
its operation found on the way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import attention as engine
from service.operations import sizes
from service.operations.sizes import Params, Work, batch_size
from service.problems import UNKNOWN_TOKEN, ValidationProblem, pointer
from service.runtime import metrics
from service.settings import Limits

Result = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Prepared:
    """One request made ready, once: its ``params``, what it computes (``work``, already checked against the
    limits), and what its operation found on the way (``found``: a model, its word pieces, the chosen layers and
    heads), which its compute takes from here rather than finding again."""

    params: Params
    work: Work
    found: Any = None


def sized(work: Callable[[Params], Work]) -> Callable[[Params, Limits], Prepared]:
    """The ``prepare`` of an operation that finds nothing but its size: ``work(params)``, checked."""
    def prepare(params: Params, limits: Limits) -> Prepared:
        size = work(params)
        sizes.check(size, limits)
        return Prepared(params, size)

    return prepare


def cast(array: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """The input in the requested precision; values that overflow float32 are refused. An array that
    is float32 already (a v2 FP32 tensor, checked finite when decoded) is used as it is: no copy."""
    if dtype == "float64" or array.dtype == np.float32:
        return array
    with np.errstate(over="ignore"):
        narrowed = array.astype(np.float32)
    if not np.isfinite(narrowed).all():
        raise ValidationProblem.at(pointer(*name.split(".")), f"{name} has values beyond the float32 range.")
    return narrowed


def input_member(params: Params) -> str:
    """The request member that holds the input sentence: ``tokens`` or ``embeddings``."""
    return "tokens" if "tokens" in params else "embeddings"


def sentence_shape(params: Params) -> tuple[int, int, int]:
    """(batch, n, d_model) of the input sentence, from shapes alone; a ``d_model`` that differs from the
    embeddings' width is refused here, before any limit is looked at."""
    if "tokens" in params:
        return 1, len(params["tokens"]), params.get("d_model", 4)
    x = params["embeddings"]
    if params.get("d_model", x.shape[-1]) != x.shape[-1]:
        raise ValidationProblem.at(pointer("d_model"), f"d_model={params['d_model']} differs from the "
                                   f"embeddings' last dimension {x.shape[-1]}.")
    return batch_size(x), x.shape[-2], x.shape[-1]


def sentence_dims(params: Params, n: int, d_model: int) -> tuple[tuple[str, int, str], ...]:
    """The limits of the input sentence (n tokens of width d_model), blamed where the request sets them."""
    if "tokens" in params:
        return (("max_sequence_length", n, pointer("tokens")), ("max_d_model", d_model, pointer("d_model")))
    where = pointer("embeddings")
    return (("max_sequence_length", n, where), ("max_d_model", d_model, where))


def _tokens(tokens: list[str], d_model: int | None) -> np.ndarray:
    """(n, d_model) toy embeddings; unknown words are 422 pointing at each one, listing the known."""
    try:
        return engine.embed(tokens, d_model)
    except engine.UnknownTokenError as exc:
        errors = [{"pointer": pointer("tokens", i), "detail": f"unknown token {word!r}"}
                  for i, word in enumerate(tokens) if word in exc.unknown]
        raise ValidationProblem(f"Unknown tokens {exc.unknown}; known: {exc.known}.",
                                problem_type=UNKNOWN_TOKEN, errors=errors, known=exc.known) from None


def sentence(params: Params) -> np.ndarray:
    """The input X (B?, n, d_model) from ``embeddings`` or ``tokens``, plus positional encoding, cast."""
    x = _tokens(params["tokens"], params.get("d_model")) if "tokens" in params else params["embeddings"]
    if params["positional_encoding"]:
        x = x + engine.positional_encoding(x.shape[-2], x.shape[-1])
    return cast(x, params["dtype"], input_member(params))


def masking(params: Params) -> list[str]:
    """The request's causal flag, mask and precision as a picture of its weights states them."""
    mask = "given" if params.get("mask") is not None else "none"
    return [f"causal: {'yes' if params['causal'] else 'no'}", f"mask: {mask}", f"dtype: {params['dtype']}"]


def explicit_weights(params: Params) -> dict[str, np.ndarray]:
    """The explicit weights, if any, in the requested precision (float32: within its range)."""
    return {name: cast(w, params["dtype"], f"weights.{name}") for name, w in (params.get("weights") or {}).items()}


def answer(params: Params, call: Callable[[bool], tuple], trace: Callable[[], engine.AttentionTrace]) -> Result:
    """{output, weights, trace?}: ``call(return_weights)`` normally, ``trace()`` with trace=true.

    weights is null unless ``return_weights``.
    """
    extra = {}
    if params["trace"]:
        stages = trace().as_dict()
        output, weights = stages.pop("output"), stages["weights"]  # the output is the answer's, not the trace's
        extra["trace"] = stages
    else:
        output, weights = call(params["return_weights"])
    return {"output": output, "weights": weights if params["return_weights"] else None, **extra}


class EngineCall:
    """Around the engine call of a request whose ``elements`` attention weights passed the limits: counted
    (metrics.count_elements) once it answers; engine errors about one of ``arguments`` (e.g. an overflow)
    point at every request member that may have caused them, ``culprits(params)`` (JSON Pointers, built only
    then); other errors propagate unchanged. (A class, not @contextmanager: a generator costs more.)"""

    def __init__(self, arguments: tuple[str, ...], culprits: Callable[[Params], list[str]], params: Params,
                 elements: int) -> None:
        self.arguments, self.culprits, self.params, self.elements = arguments, culprits, params, elements

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, traceback: Any) -> None:
        if exc is None:
            metrics.count_elements(self.elements)
        elif isinstance(exc, engine.AttentionError) and exc.argument in self.arguments:
            errors = [{"pointer": where, "detail": exc.detail} for where in self.culprits(self.params)]
            raise ValidationProblem(exc.detail, errors=errors) from None
