"""POST /v1/models/{model}/census: where each head of a trained model looks, on average, over many texts (Clark et al.
2019, "What Does BERT Look At?"; attention/census.py computes it).

Only the request's form is checked here (a non-empty list of texts, each holding something other than white space);
how many texts (max_census_texts), how long each is and what they cost are judged by the operation, against the
limits, before it computes.
"""

from __future__ import annotations

from typing import Any

from marshmallow import ValidationError, fields, validate, validates

from schemas.base import Schema
from schemas.fields import StringList
from schemas.options import OutputOptions
from schemas.tensor import Tensor

# The statistics as the answer names them, in its order (attention.census.STATISTICS) and what each is.
STATISTICS = {
    "first": "the weight on position 0 ([CLS], or a decoder's first token)",
    "separators": "the weight on separator tokens ([SEP]); absent for a decoder, which has none",
    "self": "the weight on the row's own position",
    "previous": "the weight on the previous position (rows that have one: every real row but the first)",
    "next": "the weight on the next position (rows that have one; a decoder's is 0 by causality)",
    "punctuation": "the weight on punctuation tokens (made only of Unicode category P once white space and the "
                   "tokenizer's word markers are stripped)",
    "entropy": "the row's entropy in nats (0: one key takes all; ln n: spread evenly over n keys)",
}


class CensusRequest(OutputOptions):
    """The texts to count, and the precision of the forward passes."""

    texts = StringList(required=True, validate=validate.Length(min=1), metadata={
        "description": "1 to max_census_texts texts (GET /v1/limits), each read as POST /v1/models/{model}/attention "
                       "reads its text (at most max_text_chars code points, within the model's positions); a larger "
                       "corpus goes through a batch job, its lines combined by their counts."})
    dtype = fields.String(load_default="float32", validate=validate.OneOf(["float32", "float64"]), metadata={
        "description": "float32: the model's own precision; float64 computes from the same weights in float64."})

    @validates("texts")
    def _texts(self, value: list[str], data_key: str, **kwargs: Any) -> None:
        empty = {i: ["Must hold something other than whitespace."] for i, text in enumerate(value) if not text.strip()}
        if empty:
            raise ValidationError(empty)


class CensusItem(CensusRequest):
    """A /v1/batch item of op census: the endpoint's body plus the model's name."""

    model = fields.String(required=True, metadata={"description": "A served model's name (GET /v1/models)."})


class CensusStatistic(Schema):
    """One statistic per layer and head: the mean over ``count`` query rows."""

    mean = Tensor(required=True, ranks=(2,), metadata={
        "description": "(n_layers, n_heads): the mean over every counted query row of every text."})
    count = fields.Integer(required=True, metadata={
        "description": "The query rows the mean averages (the same for every head): to combine censuses, mean = "
                       "sum(mean_i * count_i) / sum(count_i)."})


def _statistic(name: str, required: bool = True) -> fields.Nested:
    return fields.Nested(CensusStatistic, required=required, metadata={
        "description": STATISTICS[name][0].upper() + STATISTICS[name][1:] + "."})


class CensusStatistics(Schema):
    """The census's statistics, each (n_layers, n_heads) means with the count of rows they average."""

    first = _statistic("first")
    separators = _statistic("separators", required=False)
    self = _statistic("self")
    previous = _statistic("previous")
    next = _statistic("next")
    punctuation = _statistic("punctuation")
    entropy = _statistic("entropy")


class CensusResponse(Schema):
    """How much was counted, and where each head looks on average."""

    texts = fields.Integer(required=True, metadata={"description": "The texts counted."})
    tokens = fields.Integer(required=True, metadata={
        "description": "Their tokens in all (specials included): the query rows of first, self and the others; "
                       "previous and next count one fewer per text."})
    statistics = fields.Nested(CensusStatistics, required=True)
