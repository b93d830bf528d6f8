#!/usr/bin/env python3
"""Hessian-vector product cost, tapegrad against PyTorch in the same run.

Runs build/bench/hvp and bench/torch_hvp.py alternately (rounds of each
workload), takes medians and prints two Markdown tables. Hessian-vector
products: the time of one gradient, of H v by reverse over reverse (double
backward) and forward over reverse (tg::hvp), their costs in gradients and
tapegrad's peak memory of each, against PyTorch's double backward,
torch.autograd.functional.hvp and functorch's jvp(grad) on the same loss;
the speedup is over PyTorch's fastest of the three. Forward mode: the time
of a Jacobian-vector product of the loss over one plain forward. PyTorch's threads
are set as in bench/compare.py (OpenBLAS at one thread unless it is the pool
being measured; at n > 1 threads both of its settings, the better median per
column), so that "1 thread" means one core on both sides.

    /usr/bin/python3 bench/compare_hvp.py --workloads gpt-s rnn --rounds 3
    /usr/bin/python3 bench/compare_hvp.py --out doc/bench/hvp.md   # the file the docs link

With --out it also writes the table to a Markdown file, headed by the date,
the machine, the commit and the command.
"""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import PYTHON, ensure, publish, run, torch_settings  # noqa: E402



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--workloads", nargs="+", default=["gpt-s", "gpt-m", "rnn", "lstm"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="also write the table to this Markdown file")
    a = ap.parse_args()
    ensure("torch", "python3-torch")
    rows = []
    for w in a.workloads:
        ours, theirs = [], {}
        for r in range(a.rounds):
            print(f"compare_hvp: {w} round {r + 1}/{a.rounds}", file=sys.stderr)
            common = ["--workload", w, "--reps", str(a.reps)]
            ours.append(run([os.path.join(a.build, "bench", "hvp")] + common + ["--threads", str(a.threads)]))
            for name, torch_threads, env in torch_settings(a.threads):
                theirs.setdefault(name, []).append(
                    run([PYTHON, os.path.join(HERE, "torch_hvp.py")] + common + ["--threads", str(torch_threads)],
                        env=dict(os.environ, **env)))
        med = lambda runs, k: statistics.median(x[k] for x in runs)
        best = lambda k: min(med(runs, k) for runs in theirs.values())
        # functorch's jvp(grad) where PyTorch can run it (None: it cannot).
        ft = [med(runs, "functorch_hvp_s") for runs in theirs.values()
              if all(x["functorch_hvp_s"] is not None for x in runs)]
        errors = {x["functorch_error"] for runs in theirs.values() for x in runs if x["functorch_error"]}
        rows.append(dict(w=w, grad=med(ours, "grad_s"), hvp=med(ours, "hvp_s"), fwd=med(ours, "fwd_hvp_s"),
                         peak=med(ours, "hvp_peak_mib"), fwd_peak=med(ours, "fwd_hvp_peak_mib"),
                         diff=max(x["hvp_rel_diff"] for x in ours), fwd_s=med(ours, "forward_s"),
                         jvp=med(ours, "jvp_s"), t_grad=best("grad_s"), t_hvp=best("hvp_s"),
                         t_fhvp=best("functional_hvp_s"), t_ft=min(ft) if ft else None,
                         ft_error="; ".join(sorted(errors))))
    lines = [f"Hessian-vector products, {a.threads} thread(s), medians of {a.rounds} alternating rounds "
             f"(each a median of {a.reps}), milliseconds; PyTorch in its better thread setting per column:", ""]
    lines.append("| workload | grad | rev-over-rev | fwd-over-rev | in grads (rev / fwd) | peak MiB (rev / fwd) "
                 "| PyTorch grad | double backward | functional.hvp | functorch jvp(grad) | fwd-over-rev speedup over "
                 "PyTorch's fastest |")
    lines.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        torch_best = min(t for t in (r["t_hvp"], r["t_fhvp"], r["t_ft"]) if t is not None)
        ft = f"{r['t_ft'] * 1e3:.1f}" if r["t_ft"] is not None else "fails"
        lines.append(f"| {r['w']} | {r['grad'] * 1e3:.1f} | {r['hvp'] * 1e3:.1f} | {r['fwd'] * 1e3:.1f} | "
                     f"{r['hvp'] / r['grad']:.2f} / {r['fwd'] / r['grad']:.2f} | {r['peak']:.1f} / {r['fwd_peak']:.1f} | "
                     f"{r['t_grad'] * 1e3:.1f} | {r['t_hvp'] * 1e3:.1f} | {r['t_fhvp'] * 1e3:.1f} | {ft} | "
                     f"{torch_best / r['fwd']:.2f}x |")
    lines += ["", "The two orders agree to a relative " + ", ".join(f"{r['w']} {r['diff']:.1e}" for r in rows) + "."]
    for r in rows:
        if r["ft_error"]:
            lines.append(f"functorch jvp(grad) on {r['w']}: {r['ft_error']}")
    lines += ["", "Forward mode, tapegrad: a Jacobian-vector product of the loss along v over one forward (no_grad):", "",
              "| workload | forward | jvp | jvp / forward |", "|---|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['w']} | {r['fwd_s'] * 1e3:.1f} | {r['jvp'] * 1e3:.1f} | {r['jvp'] / r['fwd_s']:.2f}x |")
    publish("\n".join(lines) + "\n", a.out)


if __name__ == "__main__":
    main()
