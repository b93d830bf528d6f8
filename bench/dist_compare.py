#!/usr/bin/env python3
"""Data-parallel scaling on this machine: 2 MPI ranks x 1 thread against one
process at 1 and at 2 threads, for every workload of bench/lm_train; where
the averaging's time goes (with and without overlapping backward); PyTorch
DDP (gloo, 2 processes x 1 thread, bench/ddp_torch.py) next to PyTorch at 1
thread on GPT-S and GPT-M; and the allreduce time against message size
(build/bench/allreduce_bw).

Every configuration runs in a fresh process, all of a workload's
configurations alternate `--repeats` times, and the tables give medians
(min-max). Writes OUT/dist_compare.md, headed by the date, the machine, the
commit and the command (doc/distributed.md reads doc/bench/dist_compare.md),
and OUT/dist_compare.json.

    python3 bench/dist_compare.py                         # everything, 3 repeats
    python3 bench/dist_compare.py --out doc/bench         # the file the docs link
    python3 bench/dist_compare.py --workloads gpt-s --repeats 1 --no-torch
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from compare import provenance, write_atomically  # noqa: E402
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
# No pinning: the ranks share the cores with the pool threads and everything else.
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def run(cmd, env_threads, timeout=1200):
    """The JSON lines cmd printed, or None (reported) if it failed or hung."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(env_threads), OMP_NUM_THREADS=str(env_threads))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"dist_compare: {' '.join(cmd)} ran past {timeout} s", file=sys.stderr)
        return None
    if p.returncode != 0:
        print(f"dist_compare: {' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}", file=sys.stderr)
        return None
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def configs(w, text, steps, torch, build):
    lm = [os.path.join(build, "bench", "lm_train"), "--workload", w, "--text-dir", text, "--steps", str(steps)]
    out = {
        "tg 1x1": (lm + ["--threads", "1"], 1),
        "tg 1x2": (lm + ["--threads", "2"], 2),
        "tg 2x1": (MPIRUN + lm + ["--threads", "1"], 1),
        "tg 2x1 no-overlap": (MPIRUN + lm + ["--threads", "1", "--no-overlap"], 1),
    }
    if torch:
        py = ["--workload", w, "--text-dir", text, "--steps", str(steps), "--threads", "1"]
        out["torch 1x1"] = ([PYTHON, os.path.join(ROOT, "bench", "torch_lm.py")] + py, 1)
        out["torch ddp 2x1"] = ([PYTHON, os.path.join(ROOT, "bench", "ddp_torch.py"), "--procs", "2"] + py, 1)
    return out


def med(xs):
    if not xs:
        return "failed"
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})" if len(xs) > 1 else f"{xs[0]:.0f}"


def ratio(a, b):
    return f"{a / b:.2f}" if a and b else ""


# Links of many machines: per-message latency alpha (s) and achievable
# bandwidth beta (bytes/s), assumed, not measured here: MPI over TCP on
# 10 Gb/s Ethernet, and RDMA (InfiniBand / RoCE) at 100 Gb/s.
LINKS = {"10 Gb/s": (30e-6, 1.1e9), "100 Gb/s": (5e-6, 11e9)}


def ring(p, S, k, alpha, beta):
    """Seconds for k ring allreduces of S bytes in all over p machines: each
    is p-1 reduce-scatter and p-1 allgather steps, every machine sending and
    receiving 2(p-1)/p of its bytes."""
    return k * 2 * (p - 1) * alpha + 2 * (p - 1) / p * S / beta


def model_tables(results, bw):
    """The ring-allreduce cost model, calibrated on this machine (compute per
    step, the backward window that communication can hide behind, bucket
    count), checked against the 2-rank runs, then extrapolated to many
    machines (weak scaling: each machine runs the workload's whole batch at
    2 threads)."""
    # Shared-memory alpha and beta from the fastest calls (what the transport
    # does when both ranks are on a core; with p = 2 the model is
    # t = 2 alpha + S / beta): alpha from the messages up to 16 KiB, beta the
    # best rate of the messages from 256 KiB on.
    alpha = min(b["iallreduce_fastest_us"] for b in bw if b["bytes"] <= 16384) * 1e-6 / 2
    beta = max(b["bytes"] / (b["iallreduce_fastest_us"] * 1e-6 - 2 * alpha) for b in bw if b["bytes"] >= 262144)
    lines = ["", "## Ring-allreduce model: T = k*2(p-1)*alpha + 2(p-1)/p * S/beta", "",
             f"This machine (shared memory, from the fastest calls above): alpha = {alpha * 1e6:.1f} us, "
             f"beta = {beta / 1e9:.2f} GB/s.", "",
             "| workload | S = gradient bytes/step | k buckets | compute/step (1 machine, 2T) | window share | "
             "2 ranks: allreduce/step measured (no overlap) | model |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    params = {}
    for w, rs in results.items():
        wl = rs["tg 2x1"][0]
        S, k = wl["allreduce_bytes_per_step"], wl["buckets"]
        tok_step = wl["tokens_per_step"]
        compute = tok_step / statistics.median(x["tokens_per_s"] for x in rs["tg 1x2"])
        window = statistics.median(x["window_share"] for x in rs["tg 2x1"])
        no = rs["tg 2x1 no-overlap"]
        measured = statistics.median(x["wait_share"] * tok_step / x["tokens_per_s"] for x in no)
        params[w] = (S, k, compute, window)
        lines.append(f"| {w} | {S} | {k} | {compute * 1e3:.1f} ms | {window:.0%} | {measured * 1e3:.2f} ms | "
                     f"{ring(2, S, k, alpha, beta) * 1e3:.2f} ms |")
    # A faster machine shrinks compute and the window alike, not the bytes.
    for speedup in (1, 16):
        lines += ["", f"Predicted efficiency E = compute / (compute + exposed), exposed = max(T(one bucket), T - window), "
                  + ("machines like this one:" if speedup == 1 else f"machines {speedup}x faster than this one:"), "",
                  "| workload | " + " | ".join(f"{p} x {l}" for l in LINKS for p in (8, 64)) + " |",
                  "|---|" + "--:|" * (2 * len(LINKS))]
        for w, (S, k, compute, window) in params.items():
            c = compute / speedup
            cells = []
            for l, (a, b) in LINKS.items():
                for p in (8, 64):
                    exposed = max(ring(p, S / k, 1, a, b), ring(p, S, k, a, b) - window * c)
                    cells.append(f"{c / (c + exposed):.0%}")
            lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="gpt-s,gpt-m,rnn,lstm")
    ap.add_argument("--torch-workloads", default="gpt-s,gpt-m")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--text-dir", default=os.path.join(ROOT, "out", "bench", "text"))
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory with bench/lm_train")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.text_dir, "train.txt")):
        subprocess.run([os.path.join(a.build, "bench", "lm_train"), "--write-text", a.text_dir], check=True)
    os.makedirs(a.out, exist_ok=True)

    results = {}  # workload -> config -> [json]
    for w in a.workloads.split(","):
        cs = configs(w, a.text_dir, a.steps, not a.no_torch and w in a.torch_workloads.split(","), a.build)
        results[w] = {name: [] for name in cs}
        for r in range(a.repeats):
            for name, (cmd, t) in cs.items():
                res = run(cmd, t)
                if res:  # a failed run is left out of the medians (and was reported)
                    results[w][name].append(res[-1])
                    print(f"{w} #{r + 1} {name}: {res[-1]['tokens_per_s']:.0f} tok/s", file=sys.stderr, flush=True)

    lines = ["## Throughput (tokens/s, median (min-max) of %d alternating runs, %d timed steps each)" % (a.repeats, a.steps), "",
             "| workload | 1 rank x 1T | 1 rank x 2T | 2 ranks x 1T | 2R / 1R1T | 2R / 1R2T | PyTorch 1x1T | PyTorch DDP 2x1T | DDP / PyTorch 1T | 2R tapegrad / DDP |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    tps = lambda w, c: [x["tokens_per_s"] for x in results[w].get(c, [])]
    m = lambda w, c: statistics.median(tps(w, c)) if tps(w, c) else None
    for w in results:
        row = [w, med(tps(w, "tg 1x1")), med(tps(w, "tg 1x2")), med(tps(w, "tg 2x1")),
               ratio(m(w, "tg 2x1"), m(w, "tg 1x1")), ratio(m(w, "tg 2x1"), m(w, "tg 1x2"))]
        if "torch 1x1" in results[w]:
            row += [med(tps(w, "torch 1x1")), med(tps(w, "torch ddp 2x1")),
                    ratio(m(w, "torch ddp 2x1"), m(w, "torch 1x1")), ratio(m(w, "tg 2x1"), m(w, "torch ddp 2x1"))]
        else:
            row += ["", "", "", ""]
        lines.append("| " + " | ".join(row) + " |")

    lines += ["", "## The averaging (2 ranks x 1T; shares of rank 0's step time, medians)", "",
              "| workload | gradient MiB/step | buckets | overlap: in hooks | overlap: waiting after backward | "
              "no overlap: skew at barrier | no overlap: allreduce | hidden by overlap |",
              "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for w in results:
        ov, no = results[w]["tg 2x1"], results[w]["tg 2x1 no-overlap"]
        sm = lambda rs, k: statistics.median(x[k] for x in rs)
        hidden = max(0.0, 1 - sm(ov, "wait_share") / sm(no, "wait_share")) if sm(no, "wait_share") > 0 else 0.0
        lines.append(f"| {w} | {ov[0]['allreduce_bytes_per_step'] / 2**20:.2f} | {ov[0]['buckets']} | "
                     f"{sm(ov, 'hook_share'):.1%} | {sm(ov, 'wait_share'):.1%} | {sm(no, 'skew_share'):.1%} | "
                     f"{sm(no, 'wait_share'):.1%} | {hidden:.0%} |")

    bw = run(MPIRUN + [os.path.join(a.build, "bench", "allreduce_bw")], 1)
    if not bw:
        sys.exit("dist_compare: allreduce_bw failed")
    lines += ["", "## Allreduce of float32 between 2 ranks on this machine (time per call: median, fastest; "
              "bandwidth of the fastest)", "",
              "| bytes | MPI_Iallreduce+Wait median us | fastest us | algbw GB/s | MPI_Allreduce median us | fastest us | algbw GB/s |",
              "|--:|--:|--:|--:|--:|--:|--:|"]
    for b in bw:
        lines.append(f"| {b['bytes']} | {b['iallreduce_median_us']:.1f} | {b['iallreduce_fastest_us']:.1f} | "
                     f"{b['iallreduce_algbw_gbs']:.2f} | {b['allreduce_median_us']:.1f} | {b['allreduce_fastest_us']:.1f} | "
                     f"{b['allreduce_algbw_gbs']:.2f} |")
    lines += model_tables(results, bw)
    text = "\n".join(lines) + "\n"
    print(text)
    write_atomically(os.path.join(a.out, "dist_compare.md"), provenance() + text)
    write_atomically(os.path.join(a.out, "dist_compare.json"), json.dumps({"runs": results, "allreduce": bw}, indent=1))


if __name__ == "__main__":
    main()
