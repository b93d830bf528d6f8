#!/usr/bin/env python3
"""How tapegrad's training scales with cores, and what that predicts for many.

Measures, in one run on this machine:
  * the host's own two-core scaling h: the core-peak register loop of each dtype
    (bench/peak.h, bench_gemm's BM_core_peak_*) run alone on core 0, then on
    cores 0 and 1 at once; h is the two rates summed over the lone one. On a
    VM two vCPUs can share a physical core, so h can fall well short of 2, and
    no program can scale past it.
  * tokens/s of every workload at 1 and 2 threads, alternating, `--repeats`
    runs each (fresh processes, medians), and the MFU lm_train reports.
Then fits Amdahl's law with the two cores weighted by the host: a step whose
fraction s runs serially (or waits: barriers, load imbalance, memory
bandwidth) takes s + (1 - s)/h of its one-thread time on two threads, so
    s = (h / S2 - 1) / (h - 1),   S2 the measured 2T/1T,
and predicts the speedup on n cores that each keep their lone rate,
1 / (s + (1 - s)/n). It is a model: s measured at two threads lumps together
everything that does not shrink with threads, and a larger machine adds its
own costs (more barriers, slices of a GEMM too small for its kernels, a
shared memory bus), so the prediction is an upper bound. The target 16T/1T >= 10
needs s <= 0.04.

    scripts/setup.sh && python3 bench/scaling.py                       # all four workloads, f32 and bf16
    python3 bench/scaling.py --workloads gpt-s --dtype bf16 --repeats 2 --out ''

Writes OUT/scaling.md (headed by the date, the machine, the commit and the
command); --out '' only prints.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (its run, provenance and publish)

ROOT = compare.ROOT
LOOPS = {"f32": "BM_core_peak_f32", "bf16": "BM_core_peak_bf16"}


def peak_rate(bench_gemm, loop, core):
    """Starts the core-peak loop of `loop` pinned to `core`; returns the process (its GFLOP/s: loop_rate)."""
    return subprocess.Popen(["taskset", "-c", str(core), bench_gemm, f"--benchmark_filter=^{loop}$",
                             "--benchmark_format=json", "--benchmark_min_time=0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def loop_rate(proc):
    out, _ = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"scaling: {' '.join(proc.args)} failed")
    return json.loads(out)["benchmarks"][0]["GFLOP/s"]


def host_scaling(bench_gemm, loop, repeats):
    """(lone GFLOP/s, the two cores' GFLOP/s at once) for the loop, medians of `repeats` alternations."""
    lone, both = [], []
    for _ in range(repeats):
        lone.append(loop_rate(peak_rate(bench_gemm, loop, 0)))
        pair = [peak_rate(bench_gemm, loop, c) for c in (0, 1)]
        both.append(sum(loop_rate(p) for p in pair))
    return statistics.median(lone), statistics.median(both)


def serial_fraction(h, s2):
    """Amdahl's serial fraction from the two-thread speedup s2 on a host whose two cores give h times one."""
    if h <= 1.0:
        return float("nan")
    return min(1.0, max(0.0, (h / s2 - 1.0) / (h - 1.0)))


def predicted(s, n):
    return 1.0 / (s + (1.0 - s) / n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="gpt-s,gpt-m,rnn,lstm")
    ap.add_argument("--dtype", default="f32,bf16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--cores", type=int, default=16, help="the core count to predict for")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"), help="directory of scaling.md ('' : none)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory whose programs run")
    a = ap.parse_args()
    lm_train, bench_gemm = (os.path.join(a.build, "bench", x) for x in ("lm_train", "bench_gemm"))
    for exe in (lm_train, bench_gemm):
        if not os.path.exists(exe):
            sys.exit(f"scaling: {exe} is missing: run scripts/setup.sh first")
    if (os.cpu_count() or 1) < 2:
        sys.exit("scaling: needs two cores at least")
    dtypes = [d for d in ("f32", "bf16") if d in a.dtype.split(",")]
    if not dtypes:
        sys.exit(f"scaling: --dtype {a.dtype}: give f32, bf16 or f32,bf16")
    text = os.path.join(ROOT, "out", "bench", "text")
    if not os.path.exists(os.path.join(text, "train.txt")):
        brown = subprocess.run([os.path.join(ROOT, "scripts", "fetch_brown.sh")], capture_output=True, text=True,
                               check=True).stdout.strip().splitlines()[-1]
        subprocess.run([lm_train, "--write-text", text, "--brown-dir", brown], check=True)

    host = {}
    for d in dtypes:
        lone, both = host_scaling(bench_gemm, LOOPS[d], a.repeats)
        host[d] = (lone, both, both / lone)
        print(f"host {d} loop: one core {lone:.1f} GFLOP/s, two at once {both:.1f} (x{both / lone:.2f})",
              file=sys.stderr)

    rows = []
    for w in a.workloads.split(","):
        for d in dtypes:
            runs = {1: [], 2: []}
            for r in range(a.repeats):
                for t in (1, 2):  # alternating, so a busy spell falls on both
                    runs[t].append(compare.run([lm_train, "--workload", w, "--text-dir", text, "--threads", str(t),
                                                "--dtype", d, "--warmup", "3", "--steps", str(a.steps)]))
                print(f"{w} {d} rep {r + 1}: " + ", ".join(f"{t}T {runs[t][-1]['tokens_per_s']:.0f} tok/s"
                                                          for t in (1, 2)), file=sys.stderr)
            med = {t: statistics.median(x["tokens_per_s"] for x in runs[t]) for t in (1, 2)}
            mfu = {t: statistics.median(x["mfu"] for x in runs[t]) for t in (1, 2)}
            h = host[d][2]
            s2 = med[2] / med[1]
            s = serial_fraction(h, s2)
            rows.append(f"| {w} | {d} | {med[1]:,.0f} | {med[2]:,.0f} | {s2:.2f} | {h:.2f} | {s2 / h:.0%} "
                        f"| {mfu[1]:.0%} / {mfu[2]:.0%} | {s:.3f} | {predicted(s, a.cores):.1f} |")
    head = (f"Host two-core scaling, the core-peak loop alone on core 0 against on cores 0 and 1 at once "
            f"(medians of {a.repeats}): " +
            "; ".join(f"{d} {lone:.1f} GFLOP/s alone, {both:.1f} together, h = {h:.2f}"
                      for d, (lone, both, h) in host.items()) + ".\n\n"
            f"Training, {a.steps} timed steps a run, medians of {a.repeats} alternating runs. *s* is the serial "
            f"fraction fitted from 2T/1T and h; the last column, the speedup predicted on {a.cores} cores that "
            f"each keep their lone rate (an upper bound).\n\n"
            f"| workload | dtype | tok/s 1T | tok/s 2T | 2T/1T | host h | 2T/1T over h | MFU 1T / 2T | s "
            f"| predicted {a.cores}T/1T |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
    out = os.path.join(a.out, "scaling.md") if a.out else None
    if out:
        os.makedirs(a.out, exist_ok=True)
    compare.publish(head + "\n".join(rows) + "\n", out)


if __name__ == "__main__":
    main()
