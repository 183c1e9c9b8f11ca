#!/usr/bin/env python3
"""What any hot-row cache of staleness s can save on px-bench sparse's workload.

Draws the benchmark's lookups (Zipf(S) over ROWS rows, LOOKUPS x WORKERS per node per step)
for one of NODES nodes and counts, over the rows other nodes own, the rows pulled and the
gradient rows pushed per step under two caches of staleness s, as a fraction of the same
steps without a cache (pull + push rows; bytes follow rows, both directions alike):

  rule   the daemon's (daemon/sparse/hot_row_cache.h): kept on a second ask within s steps;
  ideal  every fetched row kept, unlimited room: the most a copy that serves s steps saves.

  /usr/bin/python3 tools/bench/cache_ceiling.py [--staleness 4,16] [--zipf 1.0]
"""
import argparse

import numpy as np


def simulate(rows, draws, nodes, steps, s, p, rng, ideal):
    fetched, asked, held = {}, {}, set()
    base = pulled = pushed = 0
    for n in range(steps):
        unique = np.unique(rng.choice(rows, draws, p=p))
        remote = unique[unique % nodes != 0].tolist()  # striped rows: node 0 owns 1/NODES
        base += 2 * len(remote)
        for r in remote:
            f = fetched.get(r)
            if f is not None and n - f <= s:
                continue
            pulled += 1
            a = asked.get(r)
            if f is not None or ideal or (a is not None and n - a <= s):
                fetched[r] = n
            asked[r] = n
        in_push = set(remote)
        for r in remote:
            f = fetched.get(r)
            if f is not None and n + 1 - f <= s:
                held.add(r)
                continue
            pushed += 1
            held.discard(r)
        for r in list(held):
            if r not in in_push and n + 1 - fetched[r] > s:
                pushed += 1
                held.discard(r)
    return (pulled + pushed) / base


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=800000)
    ap.add_argument("--lookups", type=int, default=8192)
    ap.add_argument("--workers-per-node", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--staleness", default="1,2,4,8,16")
    args = ap.parse_args()
    p = np.arange(1, args.rows + 1, dtype=np.float64) ** -args.zipf
    p /= p.sum()
    draws = args.lookups * args.workers_per_node
    for s in (int(x) for x in args.staleness.split(",")):
        fractions = []
        for ideal in (False, True):
            rng = np.random.default_rng(1)
            fractions.append(simulate(args.rows, draws, args.nodes, args.steps, s, p, rng, ideal))
        print(f"staleness {s:3d}: rows on the wire, rule {fractions[0]:.3f}x, "
              f"ideal {fractions[1]:.3f}x of no cache")


if __name__ == "__main__":
    main()
