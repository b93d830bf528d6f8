#!/usr/bin/env python3
"""Hessian-vector product cost, tapegrad against PyTorch in the same run.

Runs build/bench/hvp and bench/torch_hvp.py alternately (rounds of each
workload), takes medians and prints a Markdown table: the time of one
gradient, of a Hessian-vector product by double backward, their ratio, and
PyTorch's torch.autograd.functional.hvp on the same loss. PyTorch's threads
are set as in bench/compare.py (OpenBLAS at one thread unless it is the pool
being measured; at n > 1 threads both of its settings, the better median per
column), so that "1 thread" means one core on both sides.

    /usr/bin/python3 bench/compare_hvp.py --workloads gpt-s rnn --rounds 3
    /usr/bin/python3 bench/compare_hvp.py --out doc/bench/hvp.md   # the file the docs link

With --out it also writes the table to a Markdown file, headed by the date,
the machine, the commit and the command.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import provenance, torch_settings  # noqa: E402


def run(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--workloads", nargs="+", default=["gpt-s", "gpt-m", "rnn", "lstm"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="also write the table to this Markdown file")
    a = ap.parse_args()
    rows = []
    for w in a.workloads:
        ours, theirs = [], {}
        for r in range(a.rounds):
            print(f"compare_hvp: {w} round {r + 1}/{a.rounds}", file=sys.stderr)
            common = ["--workload", w, "--reps", str(a.reps)]
            ours.append(run([os.path.join(a.build, "bench", "hvp")] + common + ["--threads", str(a.threads)]))
            for name, torch_threads, env in torch_settings(a.threads):
                theirs.setdefault(name, []).append(
                    run([sys.executable, os.path.join(HERE, "torch_hvp.py")] + common + ["--threads", str(torch_threads)],
                        env=dict(os.environ, **env)))
        med = lambda runs, k: statistics.median(x[k] for x in runs)
        best = lambda k: min(med(runs, k) for runs in theirs.values())
        rows.append((w, med(ours, "grad_s"), med(ours, "hvp_s"), best("grad_s"), best("hvp_s"),
                     best("functional_hvp_s")))
    lines = [f"Hessian-vector products, {a.threads} thread(s), medians of {a.rounds} alternating rounds "
             f"(each a median of {a.reps}), milliseconds; PyTorch in its better thread setting per column:", "",
             "| workload | tapegrad grad | tapegrad HVP | HVP / grad | PyTorch grad | PyTorch HVP | HVP / grad "
             "| functional.hvp | tapegrad speedup on HVP |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for w, g, h, tg_, th, tf in rows:
        lines.append(f"| {w} | {g * 1e3:.1f} | {h * 1e3:.1f} | {h / g:.2f}x | {tg_ * 1e3:.1f} | {th * 1e3:.1f} | "
                     f"{th / tg_:.2f}x | {tf * 1e3:.1f} | {th / h:.2f}x |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(provenance() + text)
        print(f"wrote {a.out}")

if __name__ == "__main__":
    main()
