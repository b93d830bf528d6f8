#!/usr/bin/env python3
"""What the study's scale part would take on R ranks, replayed from a run.

The scale part runs in rounds (examples/study/scale.cpp): the first holds
every learning-rate sweep's grid; each later one the rates that sweeps still
at an end try next, and the training runs of every model whose sweep settled
in the round before. Within a round, run_cells deals the runs longest first
(parameters x steps) to the rank with the least work so far, and the round
ends with its slowest rank. This script rebuilds those rounds from a run's
scale.csv and deals each run's measured seconds over R ranks, so its answer
holds for ranks as fast as the run's were (the same threads per rank on the
same kind of machine); it ignores the time between runs (evaluation of the
context table, start-up, gathering results).

    scripts/study_schedule.py OUT [--ranks 1,2,16,32] [--lrs 1e-3,3e-3,1e-2]

OUT is the study's --out; --lrs the sweep grid the run used (the study's own
--lrs, whose default this is).
"""
import argparse
import csv
import math
import os
from collections import defaultdict


def rounds_of(rows, grid):
    """The runs of each round, as (cost, seconds) pairs, in the order the study builds them."""
    sweeps = defaultdict(list)  # (model, size) -> its sweep rows
    training = defaultdict(list)
    for r in rows:
        (sweeps if r["role"] == "sweep" else training)[(r["model"], int(r["size"]))].append(r)
    rounds = defaultdict(list)
    for key, runs in sweeps.items():
        lo, hi = min(grid), max(grid)
        # A rate past the grid is tried one round after the one before it.
        extra = sorted((r for r in runs if not any(math.isclose(float(r["lr"]), g) for g in grid)),
                       key=lambda r: abs(math.log(float(r["lr"]) / (lo if float(r["lr"]) < lo else hi))))
        for r in runs:
            k = 0 if r not in extra else 1 + extra.index(r)
            rounds[k].append(r)
        for r in training.get(key, []):
            rounds[1 + len(extra)].append(r)
    return [[(float(r["params"]) * float(r["steps"]), float(r["seconds"])) for r in rounds[k]]
            for k in sorted(rounds)]


def wall(rounds, ranks):
    """Seconds until the last round ends on `ranks` ranks, each round dealt longest first."""
    total = 0.0
    for runs in rounds:
        load, busy = [0.0] * ranks, [0.0] * ranks
        for cost, seconds in sorted(runs, key=lambda x: -x[0]):
            r = min(range(ranks), key=lambda i: load[i])
            load[r] += cost
            busy[r] += seconds
        total += max(busy)
    return total


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
    rounds = rounds_of(rows, [float(x) for x in a.lrs.split(",")])
    work = sum(s for runs in rounds for _, s in runs)
    print(f"{len(rows)} runs in {len(rounds)} rounds, {work / 3600:.2f} h of run time in all")
    print("runs per round: " + ", ".join(str(len(runs)) for runs in rounds))
    print("| ranks | wall time | ranks busy |")
    print("|--:|--:|--:|")
    for n in (int(x) for x in a.ranks.split(",")):
        w = wall(rounds, n)
        print(f"| {n} | {w / 60:.1f} min | {work / (n * w):.0%} |")


if __name__ == "__main__":
    main()
