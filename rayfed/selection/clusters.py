"""CACS's client order (FedMoS, Wang et al., INFOCOM 2023, Sec. IV-C): clients clustered by the directions of their full
local gradients after the warm-up, clusters by descending total importance, and clients by
descending importance inside each; Algorithm 2 then fills the draws in this order, so that a draw
tends to hold similar clients.

The distance is the angle between two gradients, arccos of their cosine similarity; the clusters
are a Ward-linkage dendrogram cut into K (scipy's linkage and fcluster "maxclust", as the authors'
code does). Ties in the order go to the smaller client id.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClientOrder:
    order: np.ndarray       # client ids, the order pi Algorithm 2 fills the draws in
    labels: np.ndarray      # each client's cluster, numbered 0.. in the order the clusters come in pi


def cosine_similarities(gradients: np.ndarray) -> np.ndarray:
    """cos(g_i, g_j), exactly symmetric, clipped to [-1, 1], 1 on the diagonal; a zero gradient has
    similarity 0 with every other."""
    gradients = np.asarray(gradients, dtype=np.float64)
    norms = np.linalg.norm(gradients, axis=1)
    unit = np.divide(gradients, norms[:, None], out=np.zeros_like(gradients), where=norms[:, None] > 0)
    cosines = np.clip(unit @ unit.T, -1.0, 1.0)
    cosines = (cosines + cosines.T) / 2          # exactly symmetric, whatever the product's rounding
    np.fill_diagonal(cosines, 1.0)
    return cosines


def angular_distances(gradients: np.ndarray) -> np.ndarray:
    """delta_ij = arccos(cos(g_i, g_j)); a zero gradient is at pi/2 from every other."""
    return np.arccos(cosine_similarities(gradients))


def cluster_order(gradients: np.ndarray, counts: np.ndarray, num_clusters: int) -> ClientOrder:
    """The CACS order of clients 0..N-1 with full local gradients `gradients` (N x d) and sample
    counts `counts` (importances p_i proportional to them), in at most `num_clusters` clusters."""
    counts = np.asarray(counts, dtype=np.int64)
    num_clients = len(counts)
    if num_clients == 1 or num_clusters == 1:
        clusters = np.zeros(num_clients, dtype=np.int64)
    else:
        # Imported here: scipy's clustering takes 0.4 s to import, in every Ray worker process that imports rayfed.
        from scipy.cluster.hierarchy import fcluster, linkage
        from scipy.spatial.distance import squareform
        tree = linkage(squareform(angular_distances(gradients), checks=False), method="ward")
        clusters = fcluster(tree, t=min(num_clusters, num_clients), criterion="maxclust") - 1
    ids = np.arange(num_clients)
    mass = np.bincount(clusters, weights=counts)
    first_member = np.full(len(mass), num_clients)
    np.minimum.at(first_member, clusters, ids)
    present = np.flatnonzero(np.bincount(clusters, minlength=len(mass)))
    cluster_rank = np.empty(len(mass), dtype=np.int64)
    cluster_rank[present[np.lexsort((first_member[present], -mass[present]))]] = np.arange(len(present))
    labels = cluster_rank[clusters]
    return ClientOrder(order=fill_order(labels, counts), labels=labels)


def fill_order(labels: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The order of clients 0..N-1 whose clusters, numbered in the order they come, are `labels`:
    by cluster, then by descending importance (sample count), then by id."""
    return np.lexsort((np.arange(len(labels)), -np.asarray(counts, dtype=np.int64), labels))


def order_problem(order: np.ndarray, labels: np.ndarray, counts: np.ndarray, num_clusters: int) -> str | None:
    """Why (`order`, `labels`) cannot be cluster_order's for clients with sample counts `counts` in
    at most `num_clusters` clusters, or None."""
    num_clients = len(counts)
    if not np.array_equal(np.sort(order), np.arange(num_clients)):
        return f"order is not a permutation of the clients 0-{num_clients - 1}"
    used = np.unique(labels)
    most = min(num_clusters, num_clients)
    if not np.array_equal(used, np.arange(len(used))) or len(used) > most:
        return f"labels are not clusters numbered 0, 1, ... (at most {most})"
    if not np.array_equal(order, fill_order(labels, counts)):
        return "order is not the clusters' order for its labels and the clients' sample counts"
    return None
