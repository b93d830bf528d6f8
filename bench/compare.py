#!/usr/bin/env python3
"""Side-by-side training throughput: tapegrad vs PyTorch and gensim (and the GEMM peak).

Runs every workload at 1 and 2 threads, alternating tapegrad / reference
(A/B/A/B...) `--repeats` times in one run, each run in a fresh process, and
reports the median tokens/s (words/s for sgns) with min-max, the ratio, the
matmul GFLOP/s inside tapegrad's step next to the OpenBLAS sgemm peak measured
in the same run at the same thread count, and peak RSS. At n > 1 threads
PyTorch runs in both of its settings -- its own threads (torch.set_num_threads(n),
OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=1) and OpenBLAS's (set_num_threads(1),
OPENBLAS_NUM_THREADS=n); two pools of n threads each would oversubscribe the
cores -- and the ratio is against the better median of the two; the table
names it. tapegrad's own gain from n threads (n-thread median over 1-thread
median) is a column of its own.
The language models are bench/lm_train (tapegrad) and bench/torch_lm.py;
sgns is examples/word2vec against gensim (bench/compare_word2vec.py --one).
Then "same learning": GPT-S trained --learning-steps steps from the same
settings on both sides, validation loss on 20 fixed batches.

    scripts/setup.sh && python3 bench/compare.py            # everything
    python3 bench/compare.py --workloads gpt-s --repeats 3 --learning-steps 0

Writes OUT/compare.md and OUT/compare.csv. Needs python3-torch and
python3-gensim; installs them when run as root.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LM_TRAIN = os.path.join(ROOT, "build", "bench", "lm_train")
W2V = os.path.join(ROOT, "build", "examples", "word2vec")
# Debian's interpreter, where python3-torch installs (a python3 earlier on PATH may lack torch).
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"compare: {' '.join(cmd)} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ensure(module, package):
    if subprocess.run([PYTHON, "-c", f"import {module}"], capture_output=True).returncode == 0:
        return
    if os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], check=True)
    else:
        sys.exit(f"compare: {module} is missing: sudo apt-get install {package}")


# PyTorch's two ways of using t threads: its intra-op pool, or OpenBLAS's threads.
def torch_settings(t):
    own = ("torch threads", t, dict(OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS=str(t)))
    blas = ("OpenBLAS threads", 1, dict(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS=str(t), MKL_NUM_THREADS="1"))
    return [own] if t == 1 else [own, blas]


def lm_pair(w, t, text, extra=(), all_settings=True):
    """One tapegrad run and one PyTorch run per setting (or in its first) of language-model workload w at t threads."""
    common = ["--workload", w, "--text-dir", text] + list(extra)
    ours = run([LM_TRAIN] + common + ["--threads", str(t)])
    theirs = {}
    for name, torch_threads, env in torch_settings(t)[:None if all_settings else 1]:
        theirs[name] = run([PYTHON, os.path.join(ROOT, "bench", "torch_lm.py")] + common + ["--threads", str(torch_threads)],
                           env=dict(os.environ, **env))
    return ours, theirs


def sgns_pair(t, a, sentences):
    """One run of examples/word2vec and one of gensim at t worker threads."""
    cmd = [PYTHON, os.path.join(ROOT, "bench", "compare_word2vec.py"), "--exe", W2V, "--corpus", sentences,
           "--threads", str(t)] + (["--wordsim", a.wordsim] if a.wordsim else [])
    ours = run(cmd + ["--one", "tapegrad"])
    theirs = run(cmd + ["--one", "gensim"])
    ours, theirs = [dict(x, tokens_per_s=x["wps"], matmul_gflops=float("nan"), system_allocs_per_step="–")
                    for x in (ours, theirs)]
    return ours, {"gensim": theirs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="gpt-s,gpt-m,rnn,lstm,sgns")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--learning-steps", type=int, default=500, help="GPT-S steps of the same-learning check (0: skip)")
    ap.add_argument("--wordsim", help="WordSim-353 file: adds the Spearman of both sgns runs")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    a = ap.parse_args()
    workloads = a.workloads.split(",")
    ensure("torch", "python3-torch")
    if "sgns" in workloads:
        ensure("gensim", "python3-gensim")
    for exe in (LM_TRAIN, W2V):
        if not os.path.exists(exe):
            sys.exit(f"compare: {exe} is missing: run scripts/setup.sh first")
    brown = subprocess.run([os.path.join(ROOT, "scripts", "fetch_brown.sh")], capture_output=True, text=True,
                           check=True).stdout.strip().splitlines()[-1]
    text = os.path.join(a.out, "text")
    if not os.path.exists(os.path.join(text, "train.txt")):
        subprocess.run([LM_TRAIN, "--write-text", text, "--brown-dir", brown], check=True)
    sentences = os.path.join(a.out, "sentences.txt")
    if "sgns" in workloads and not os.path.exists(sentences):
        subprocess.run([W2V, "--brown-dir", brown, "--dump-sentences", sentences], check=True, capture_output=True)
    rows = []
    for t in [int(x) for x in a.threads.split(",")]:
        peak = run([LM_TRAIN, "--gemm-peak", "--threads", str(t)])["sgemm_gflops"]
        for w in workloads:
            ours, by_setting = [], {}
            for r in range(a.repeats):
                o, ps = sgns_pair(t, a, sentences) if w == "sgns" else lm_pair(w, t, text, ["--steps", str(a.steps)])
                ours.append(o)
                for name, p in ps.items():
                    by_setting.setdefault(name, []).append(p)
                unit = "words/s" if w == "sgns" else "tok/s"
                print(f"{w} threads={t} rep {r + 1}: tapegrad {o['tokens_per_s']:.0f} {unit}, "
                      + ", ".join(f"{name} {p['tokens_per_s']:.0f}" for name, p in ps.items()), file=sys.stderr)
            # The reference at its best setting: the higher median.
            setting = max(by_setting, key=lambda k: statistics.median(x["tokens_per_s"] for x in by_setting[k]))
            theirs = by_setting[setting]
            o = [x["tokens_per_s"] for x in ours]
            p = [x["tokens_per_s"] for x in theirs]
            one = [r for r in rows if r["workload"] == w and r["threads"] == 1]
            rows.append(dict(workload=w, threads=t, ours=statistics.median(o), ours_min=min(o), ours_max=max(o),
                             setting=setting, gain=statistics.median(o) / one[0]["ours"] if one and t > 1 else None,
                             other_settings=", ".join(f"{k} {statistics.median(x['tokens_per_s'] for x in v):.0f}"
                                                      for k, v in by_setting.items() if k != setting),
                             torch=statistics.median(p), torch_min=min(p), torch_max=max(p),
                             ratio=statistics.median(o) / statistics.median(p),
                             matmul_gflops=statistics.median(x["matmul_gflops"] for x in ours), sgemm_peak=peak,
                             rss_ours=max(x["peak_rss_mb"] for x in ours),
                             rss_torch=max(x["peak_rss_mb"] for x in theirs),
                             allocs=ours[-1]["system_allocs_per_step"],
                             spearman_ours=statistics.median(x.get("spearman", float("nan")) for x in ours),
                             spearman_ref=statistics.median(x.get("spearman", float("nan")) for x in theirs)))
    os.makedirs(a.out, exist_ok=True)
    head = ("| workload | threads | tapegrad tok/s (min–max) | tapegrad n/1 threads | reference tok/s (min–max), best setting "
            "| ratio | matmul GFLOP/s | sgemm peak | matmul % of peak | RSS MiB tapegrad / reference | mallocs/step |\n"
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")

    def gemm(r):
        if r["workload"] == "sgns":
            return "– | " + f"{r['sgemm_peak']:.1f} | –"
        return f"{r['matmul_gflops']:.1f} | {r['sgemm_peak']:.1f} | {100 * r['matmul_gflops'] / r['sgemm_peak']:.0f}%"

    md = head + "".join(
        f"| {r['workload']} | {r['threads']} | {r['ours']:.0f} ({r['ours_min']:.0f}–{r['ours_max']:.0f}) "
        f"| {'–' if r['gain'] is None else format(r['gain'], '.2f') + '×'} "
        f"| {r['torch']:.0f} ({r['torch_min']:.0f}–{r['torch_max']:.0f}), {r['setting']}"
        f"{' (' + r['other_settings'] + ')' if r['other_settings'] else ''} | {r['ratio']:.2f}× "
        f"| {gemm(r)} | {r['rss_ours']:.0f} / {r['rss_torch']:.0f} | {r['allocs']} |\n" for r in rows)
    md += ("\nReference: PyTorch " + subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                                                  capture_output=True, text=True).stdout.strip()
           + " for the language models; gensim for sgns (words/s over raw words × epochs).\n")
    sg = [r for r in rows if r["workload"] == "sgns" and r["spearman_ours"] == r["spearman_ours"]]
    for r in sg:
        md += (f"sgns threads={r['threads']}: WordSim-353 Spearman tapegrad {r['spearman_ours']:.4f}, "
               f"gensim {r['spearman_ref']:.4f} (diff {r['spearman_ours'] - r['spearman_ref']:+.4f})\n")
    if a.learning_steps > 0:
        # Same settings and seed on both sides, 2 threads (or the largest asked for): only the loss matters here.
        t = max(int(x) for x in a.threads.split(","))
        o, ps = lm_pair("gpt-s", t, text, ["--warmup", "0", "--steps", str(a.learning_steps), "--eval"], False)
        p = next(iter(ps.values()))
        md += (f"\nSame learning: GPT-S after {a.learning_steps} steps, validation loss on 20 fixed batches: "
               f"tapegrad {o['val_loss']:.4f}, PyTorch {p['val_loss']:.4f} nats/char "
               f"(diff {o['val_loss'] - p['val_loss']:+.4f}).\n")
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
