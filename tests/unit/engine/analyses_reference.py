"""The definitions attention/analyses.py is proven against, written out the plain way: Python loops over layers,
heads and positions, networkx for the flows, nothing shared with the engine.

* Rollout (Abnar & Zuidema 2020): A_hat_l = 0.5 mean_h A_l + 0.5 I, rows renormalised; rollout_l = A_hat_l ...
  A_hat_1.
* Flow (same paper): the maximum flow from node (0, j) to node (L, i) of the graph with an edge (l-1, j) -> (l, i)
  of capacity A_hat_l[i, j], by ``networkx.maximum_flow_value`` on the float capacities.
* Norms (Kobayashi et al. 2020): ||alpha^h_ij f_h(x_j)|| per head, ||sum_h alpha^h_ij f_h(x_j)|| per layer.
"""

from __future__ import annotations

import networkx as nx
import numpy as np


def mixed_by_loops(weights: np.ndarray) -> np.ndarray:
    """One layer's weights (h, n, n) -> A_hat (n, n), entry by entry."""
    h, n, _ = weights.shape
    mixed = np.zeros((n, n), np.float64)
    for i in range(n):
        for j in range(n):
            mixed[i, j] = 0.5 * sum(float(weights[head, i, j]) for head in range(h)) / h + (0.5 if i == j else 0.0)
        mixed[i] /= sum(mixed[i])
    return mixed


def rollout_by_loops(weights: list[np.ndarray]) -> list[np.ndarray]:
    """Every layer's weights (h, n, n) -> the rollout after each layer (n, n), products written as sums."""
    n = weights[0].shape[-1]
    rolled, out = np.eye(n), []
    for layer in weights:
        mixed = mixed_by_loops(layer)
        rolled = np.array([[sum(mixed[i, k] * rolled[k, j] for k in range(n)) for j in range(n)] for i in range(n)])
        out.append(rolled)
    return out


def flow_by_networkx(weights: list[np.ndarray]) -> np.ndarray:
    """Every layer's weights (h, n, n) -> the flows (n, n): [i, j] from input token j to last-layer position i."""
    n, n_layers = weights[0].shape[-1], len(weights)
    graph = nx.DiGraph()
    for layer, layer_weights in enumerate(weights, start=1):
        mixed = mixed_by_loops(layer_weights)
        for i in range(n):
            for j in range(n):
                if mixed[i, j] > 0:
                    graph.add_edge((layer - 1, j), (layer, i), capacity=float(mixed[i, j]))
    return np.array([[nx.maximum_flow_value(graph, (0, j), (n_layers, i))
                      if graph.has_node((0, j)) and graph.has_node((n_layers, i)) else 0.0
                      for j in range(n)] for i in range(n)])


def norms_by_loops(weights: np.ndarray, transformed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """weights (h, n, n_keys) and f_h(x_j) (h, n_keys, d_model) -> per head ||alpha f|| (h, n, n_keys) and per layer
    ||sum_h alpha f|| (n, n_keys), one vector at a time, in float64."""
    h, n, n_keys = weights.shape
    heads, layer = np.zeros((h, n, n_keys)), np.zeros((n, n_keys))
    for i in range(n):
        for j in range(n_keys):
            vectors = [float(weights[head, i, j]) * transformed[head, j].astype(np.float64) for head in range(h)]
            for head in range(h):
                heads[head, i, j] = np.sqrt(np.sum(vectors[head] ** 2))
            layer[i, j] = np.sqrt(np.sum(sum(vectors) ** 2))
    return heads, layer


def relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    """The largest absolute difference, over the reference's largest magnitude."""
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())
