"""``python -m attention``: print the seed script's five demos, formatted from ``DEMOS``."""

from __future__ import annotations

import textwrap

import numpy as np

from .demos import DEMOS


def _banner(title: str) -> None:
    print("\n" + "=" * 68 + f"\n{title}\n" + "=" * 68)


def _lookup(d: dict) -> None:
    print("tokens:", d["tokens"])
    print("dims:  ", d["dimensions"], "\n")
    print(f'query = "{d["query_token"]}", scored against every token')
    print("  raw scores (QK^T):\n", d["scores"])
    print("  scaled scores (QK^T / sqrt(d_k)):\n", d["scaled_scores"])
    print("  attention weights (each row sums to 1):\n", d["weights"])
    print("  row sums:", d["row_sums"])
    print("\noutput vector:", d["output"])


def _scaling(d: dict) -> None:
    for row in d["rows"]:
        print(f"\nd_k = {row['d_k']}")
        print(f"  raw    score std: {row['raw_std']:6.2f}  ->  max softmax weight: {row['raw_max_weight']:.4f}")
        print(f"  scaled score std: {row['scaled_std']:6.2f}  ->  max softmax weight: {row['scaled_max_weight']:.4f}")


def _positional(d: dict) -> None:
    print("without positional encoding, output sets identical?", d["identical_without_positional_encoding"])
    print("with    positional encoding, output sets identical?", d["identical_with_positional_encoding"])
    print("\npositional encoding matrix (3 positions x 4 dims):")
    print(d["positional_encoding"])


def _causal(d: dict) -> None:
    print("mask (True = allowed to look):")
    print(d["mask"].astype(int))
    print("\nresulting attention weights:")
    print(d["weights"])


def _multi_head(d: dict) -> None:
    for head, (weights, links) in enumerate(zip(d["weights"], d["strongest_links"], strict=True)):
        print(f"\nhead {head} -- what each token attends to (row = querying token):")
        for token, row, top in zip(d["tokens"], weights, links, strict=True):
            print(f"   {token:5s} -> strongest link: {top:5s}  weights: {row}")
    print(f"\nfinal output shape: {tuple(d['output_shape'])}  (n_tokens, d_model) -- unchanged")


FORMATTERS = {"lookup": _lookup, "scaling": _scaling, "positional-encoding": _positional,
              "causal-mask": _causal, "multi-head": _multi_head}


def main() -> None:
    with np.printoptions(precision=3, suppress=True):
        for number, demo in enumerate(DEMOS.values(), start=1):
            _banner(f"DEMO {number}: {demo.title}")
            FORMATTERS[demo.name](demo.run())
            print("\n" + textwrap.fill(demo.summary, width=68))


if __name__ == "__main__":
    main()
