#!/usr/bin/env python3
"""Side-by-side training throughput: tapegrad vs PyTorch (and the GEMM peak).

Runs every workload at 1 and 2 threads, alternating tapegrad / PyTorch
(A/B/A/B...) `--repeats` times in one run, each run in a fresh process, and
reports the median tokens/s with min-max, the ratio, the matmul GFLOP/s
inside tapegrad's step next to the OpenBLAS sgemm peak measured in the same
run at the same thread count, and peak RSS. PyTorch runs with
torch.set_num_threads(n), OMP_NUM_THREADS=n and OPENBLAS_NUM_THREADS=1 (its
best setting here: two pools of n threads each oversubscribe the cores).

    scripts/setup.sh && python3 bench/compare.py            # all workloads
    python3 bench/compare.py --workloads gpt-s --repeats 3 --out out/bench

Writes OUT/compare.md and OUT/compare.csv. Needs python3-torch
(apt-get install python3-torch); installs it when run as root.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LM_TRAIN = os.path.join(ROOT, "build", "bench", "lm_train")
# Debian's interpreter, where python3-torch installs (a python3 earlier on PATH may lack torch).
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"compare: {' '.join(cmd)} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ensure_torch():
    if subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode == 0:
        return
    if os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "python3-torch"], check=True)
    else:
        sys.exit("compare: PyTorch is missing: sudo apt-get install python3-torch")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="gpt-s,gpt-m,rnn,lstm")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    a = ap.parse_args()
    ensure_torch()
    if not os.path.exists(LM_TRAIN):
        sys.exit("compare: build/bench/lm_train is missing: run scripts/setup.sh first")
    text = os.path.join(a.out, "text")
    if not os.path.exists(os.path.join(text, "train.txt")):
        brown = subprocess.run([os.path.join(ROOT, "scripts", "fetch_brown.sh")], capture_output=True, text=True,
                               check=True).stdout.strip().splitlines()[-1]
        subprocess.run([LM_TRAIN, "--write-text", text, "--brown-dir", brown], check=True)
    rows = []
    for t in [int(x) for x in a.threads.split(",")]:
        peak = run([LM_TRAIN, "--gemm-peak", "--threads", str(t)])["sgemm_gflops"]
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS=str(t))
        for w in a.workloads.split(","):
            ours, theirs = [], []
            for r in range(a.repeats):
                common = ["--workload", w, "--text-dir", text, "--threads", str(t), "--steps", str(a.steps)]
                ours.append(run([LM_TRAIN] + common, env=dict(os.environ, OPENBLAS_NUM_THREADS=str(t))))
                theirs.append(run([PYTHON, os.path.join(ROOT, "bench", "torch_lm.py")] + common, env=env))
                print(f"{w} threads={t} rep {r + 1}: tapegrad {ours[-1]['tokens_per_s']:.0f} tok/s, "
                      f"pytorch {theirs[-1]['tokens_per_s']:.0f} tok/s", file=sys.stderr)
            o = [x["tokens_per_s"] for x in ours]
            p = [x["tokens_per_s"] for x in theirs]
            rows.append(dict(workload=w, threads=t, ours=statistics.median(o), ours_min=min(o), ours_max=max(o),
                             torch=statistics.median(p), torch_min=min(p), torch_max=max(p),
                             ratio=statistics.median(o) / statistics.median(p),
                             matmul_gflops=statistics.median(x["matmul_gflops"] for x in ours), sgemm_peak=peak,
                             rss_ours=max(x["peak_rss_mb"] for x in ours),
                             rss_torch=max(x["peak_rss_mb"] for x in theirs),
                             allocs=ours[-1]["system_allocs_per_step"]))
    os.makedirs(a.out, exist_ok=True)
    head = ("| workload | threads | tapegrad tok/s (min–max) | PyTorch tok/s (min–max) | ratio | matmul GFLOP/s "
            "| sgemm peak | matmul % of peak | RSS MiB tapegrad / PyTorch | mallocs/step |\n"
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
    md = head + "".join(
        f"| {r['workload']} | {r['threads']} | {r['ours']:.0f} ({r['ours_min']:.0f}–{r['ours_max']:.0f}) "
        f"| {r['torch']:.0f} ({r['torch_min']:.0f}–{r['torch_max']:.0f}) | {r['ratio']:.2f}× "
        f"| {r['matmul_gflops']:.1f} | {r['sgemm_peak']:.1f} | {100 * r['matmul_gflops'] / r['sgemm_peak']:.0f}% "
        f"| {r['rss_ours']:.0f} / {r['rss_torch']:.0f} | {r['allocs']} |\n" for r in rows)
    with open(os.path.join(a.out, "compare.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, "compare.csv"), "w") as f:
        f.write(",".join(rows[0].keys()) + "\n")
        for r in rows:
            f.write(",".join(str(v) for v in r.values()) + "\n")
    print(md)
    print(f"wrote {a.out}/compare.md and compare.csv")


if __name__ == "__main__":
    main()
