#!/usr/bin/env python3
"""What the study's scale part would take on R ranks, replayed from a run.

The scale part runs in rounds (examples/study/scale.cpp): the first holds
every learning-rate sweep's grid; each later one the rates that sweeps still
at an end try next. A model whose sweep has settled waits to train; a round
deals its sweep runs first (longest first, parameters x steps, to the rank
with the least work so far), then the waiting training runs that fit beside
them on ranks that would otherwise wait for the round's longest rank; the
last round runs all that are left. A round ends with its slowest rank. This
script rebuilds those rounds from a run's scale.csv and deals each run's
measured seconds over R ranks the same way, so its answer holds for ranks as
fast as the run's were (the same threads per rank on the same kind of
machine); it leaves out the time between runs (the context table's
evaluations, start-up, gathering results).

    scripts/study_schedule.py OUT [--ranks 1,2,16,32] [--lrs 1e-3,3e-3,1e-2]

OUT is the study's --out; --lrs the sweep grid the run used (the study's own
--lrs, whose default this is).
"""
import argparse
import csv
import math
import os
from collections import defaultdict


def plan(rows, grid):
    """The sweep runs of each round, and the training runs that start waiting at each round,
    as (cost, seconds) pairs in the order the study builds them."""
    sweeps = defaultdict(list)  # (model, size) -> its sweep rows
    training = defaultdict(list)
    for r in rows:
        (sweeps if r["role"] == "sweep" else training)[(r["model"], int(r["size"]))].append(r)
    sweep_rounds, joins = defaultdict(list), defaultdict(list)
    lo, hi = min(grid), max(grid)
    for key, runs in sweeps.items():
        # A rate past the grid is tried one round after the one before it.
        extra = sorted((r for r in runs if not any(math.isclose(float(r["lr"]), g) for g in grid)),
                       key=lambda r: abs(math.log(float(r["lr"]) / (lo if float(r["lr"]) < lo else hi))))
        for r in runs:
            sweep_rounds[0 if r not in extra else 1 + extra.index(r)].append(r)
        joins[1 + len(extra)] += training.get(key, [])
    pair = lambda r: (float(r["params"]) * float(r["steps"]), float(r["seconds"]))
    n = max(max(sweep_rounds), max(joins, default=0)) + 1
    return [[pair(r) for r in sweep_rounds[k]] for k in range(n)], [[pair(r) for r in joins[k]] for k in range(n)]


def deal(runs, load, busy, cap=math.inf):
    """Deals runs longest first onto the least-loaded rank, as the study does; returns the runs left undealt."""
    left = []
    for cost, seconds in sorted(runs, key=lambda x: -x[0]):
        r = min(range(len(load)), key=lambda i: load[i])
        if load[r] + cost > cap:
            left.append((cost, seconds))
            continue
        load[r] += cost
        busy[r] += seconds
    return left


def replay(sweep_rounds, joins, ranks):
    """Seconds until the last round ends on `ranks` ranks, and the runs of each round."""
    total, per_round, waiting, k = 0.0, [], [], 0
    while k < len(sweep_rounds) or waiting:
        sweep = sweep_rounds[k] if k < len(sweep_rounds) else []
        waiting += joins[k] if k < len(joins) else []
        k += 1
        load, busy = [0.0] * ranks, [0.0] * ranks
        deal(sweep, load, busy)
        left = deal(waiting, load, busy, max(load) if sweep else math.inf)
        per_round.append(len(sweep) + len(waiting) - len(left))
        waiting = left
        total += max(busy)
    return total, per_round


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the study's --out")
    ap.add_argument("--ranks", default="1,2,16,32", help="rank counts to replay on")
    ap.add_argument("--lrs", default="1e-3,3e-3,1e-2", help="the sweep grid the run used")
    a = ap.parse_args()
    with open(os.path.join(a.out, "scale.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"study_schedule: {a.out}/scale.csv has no runs")
    sweep_rounds, joins = plan(rows, [float(x) for x in a.lrs.split(",")])
    work = sum(s for runs in sweep_rounds + joins for _, s in runs)
    print(f"{len(rows)} runs, {work / 3600:.2f} h of run time in all")
    print("| ranks | wall time | ranks busy | runs per round |")
    print("|--:|--:|--:|---|")
    for n in (int(x) for x in a.ranks.split(",")):
        w, per_round = replay(sweep_rounds, joins, n)
        print(f"| {n} | {w / 60:.1f} min | {work / (n * w):.0%} | {', '.join(map(str, per_round))} |")


if __name__ == "__main__":
    main()
