"""Ring order of the nodes: which node follows which, closing the lap back to S0.

A lap pays every hop once (the forward hops and the return hop), so the ring's network time is
the length of a cycle through all nodes: for up to ``EXACT_MAX_NODES`` nodes it is minimised
exactly (the first node fixed, every permutation of the others: (P-1)! cycles, each direction
counted); beyond, nearest-neighbour from every start followed by 2-opt (a heuristic, stated
as such in the output). The cycle's rotation (which node is S0, hence which holds the
embeddings, the output head and the drafter) is chosen afterwards by the planner, with stage
times: lap = sum of hop latencies + sum of stage times.
"""

from __future__ import annotations

import itertools

import numpy as np

EXACT_MAX_NODES = 10


def cycle_ms(order: tuple[int, ...], one_way_ms: np.ndarray) -> float:
    return float(sum(one_way_ms[order[i], order[(i + 1) % len(order)]] for i in range(len(order))))


def all_cycles_ms(one_way_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ring with node 0 first: (orders [(P-1)!, P], cycle ms)."""
    n = len(one_way_ms)
    perms = np.array(list(itertools.permutations(range(1, n))), dtype=int).reshape(-1, n - 1)
    orders = np.column_stack([np.zeros(len(perms), dtype=int), perms])
    nxt = np.roll(orders, -1, axis=1)
    return orders, one_way_ms[orders, nxt].sum(axis=1)


def best_cycle(one_way_ms: np.ndarray) -> tuple[tuple[int, ...], str]:
    """(order, method): exact for small rings, heuristic beyond."""
    n = len(one_way_ms)
    if n <= 2:
        return tuple(range(n)), "exact"
    if n <= EXACT_MAX_NODES:
        orders, ms = all_cycles_ms(one_way_ms)
        return tuple(int(x) for x in orders[int(np.argmin(ms))]), "exact"
    best = None
    for start in range(n):
        order = _nearest_neighbour(one_way_ms, start)
        order = _two_opt(order, one_way_ms)
        c = cycle_ms(order, one_way_ms)
        if best is None or c < best[0]:
            best = (c, order)
    return best[1], "nearest-neighbour + 2-opt (heuristic)"


def worst_cycle(one_way_ms: np.ndarray) -> tuple[int, ...]:
    n = len(one_way_ms)
    if n <= 2 or n > EXACT_MAX_NODES:
        return tuple(range(n))
    orders, ms = all_cycles_ms(one_way_ms)
    return tuple(int(x) for x in orders[int(np.argmax(ms))])


def _nearest_neighbour(d: np.ndarray, start: int) -> tuple[int, ...]:
    left = set(range(len(d))) - {start}
    order = [start]
    while left:
        nxt = min(left, key=lambda j: d[order[-1], j])
        order.append(nxt)
        left.remove(nxt)
    return tuple(order)


def _two_opt(order: tuple[int, ...], d: np.ndarray) -> tuple[int, ...]:
    best = list(order)
    improved = True
    while improved:
        improved = False
        for i in range(1, len(best) - 1):
            for k in range(i + 1, len(best)):
                cand = best[:i] + best[i : k + 1][::-1] + best[k + 1 :]
                if cycle_ms(tuple(cand), d) < cycle_ms(tuple(best), d) - 1e-12:
                    best, improved = cand, True
    return tuple(best)


def rotations(order: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every rotation of a ring, both directions (same hops, different S0 and last stage)."""
    n = len(order)
    out = []
    for seq in (order, order[::-1]):
        out += [seq[i:] + seq[:i] for i in range(n)]
    return list(dict.fromkeys(out))
