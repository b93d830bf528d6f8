#!/usr/bin/env python3
"""Side-by-side training throughput: tapegrad vs PyTorch and gensim (and the GEMM peak).

Runs every workload at 1 and 2 threads, alternating tapegrad / reference
(A/B/A/B...) `--repeats` times in one run, each run in a fresh process, and
reports the median tokens/s (words/s for sgns) with min-max, the ratio, the
matmul GFLOP/s inside tapegrad's step next to the OpenBLAS sgemm peak measured
in the same run at the same thread count, tapegrad's MFU (lm_train's model
FLOP/s over threads x its measured core peak), and peak RSS. At n > 1 threads
PyTorch runs in both of its settings -- its own threads (torch.set_num_threads(n),
OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=1) and OpenBLAS's (set_num_threads(1),
OPENBLAS_NUM_THREADS=n); two pools of n threads each would oversubscribe the
cores -- and the ratio is against the better median of the two; the table
names it. tapegrad's own gain from n threads (n-thread median over 1-thread
median) is a column of its own.
The language models are bench/lm_train (tapegrad) and bench/torch_lm.py;
sgns is examples/word2vec against gensim (bench/compare_word2vec.py --one).
Then "same learning": each of --learning-workloads (GPT-S by default) trained
--learning-steps steps from the same settings on both sides, at each dtype,
validation loss on 20 fixed batches.

--dtype f32,bf16 adds bfloat16 mixed precision: `lm_train --dtype bf16`
(AutocastGuard) against torch_lm.py --dtype bf16 (torch.autocast on the CPU),
float32 master weights on both sides, each language model at both dtypes in
the same alternation (and PyTorch's better thread setting picked per dtype).
The table gains a dtype column, and a second table gives each side's bf16
over f32 speedup and peak RSS at both, where both dtypes were run. sgns has
no GEMMs: it runs in float32 only, when f32 is asked for. The same-learning
check runs once per dtype.

    scripts/setup.sh && python3 bench/compare.py            # everything
    python3 bench/compare.py --workloads gpt-s --repeats 3 --learning-steps 0
    python3 bench/compare.py --workloads gpt-s,lstm --dtype f32,bf16 --learning-steps 0

Writes OUT/compare.md (headed by the date, the machine, the commit and the
command) and OUT/compare.csv. Needs python3-torch and python3-gensim;
installs them when run as root.
"""
import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The programs of the build directory (--build sets it).
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


def write_atomically(path, text):
    """Writes text to path through a temporary file renamed over it: a reader (or an interrupted run) never sees
    half a table, and the tracked file is untouched until the new one is whole."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def publish(text, out):
    """Prints a measured table and, when out names a file, writes it there under provenance()'s line."""
    print("\n" + text)
    if out:
        write_atomically(out, provenance() + text)
        print(f"wrote {out}")


def provenance():
    """When, where and from what the table was made: date, CPU (and whether it has the AVX-512 BF16 and AMX
    instructions a bf16 GEMM can use), cores, commit (marked when the tree has uncommitted changes) and command."""
    cpu, flags = "unknown CPU", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    isa = ", ".join(name for flag, name in (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512_BF16"), ("amx_bf16", "AMX-BF16"))
                    if flag in flags) or "no AVX-512"
    git = lambda *args: subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    command = " ".join(shlex.quote(x) for x in [os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)] + sys.argv[1:])
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return f"_{date}; {cpu} ({isa}), {os.cpu_count()} cores; commit {commit}; `{command}`_\n\n"


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


def summarise(w, d, t, ours, by_setting, peak, rows):
    """One table row: workload w at dtype d and t threads, from tapegrad's runs and the reference's by setting
    (rows so far give the 1-thread median for the n/1 gain and the f32 median for the bf16 speedup)."""
    # The reference at its best setting: the higher median.
    setting = max(by_setting, key=lambda k: statistics.median(x["tokens_per_s"] for x in by_setting[k]))
    theirs = by_setting[setting]
    o = [x["tokens_per_s"] for x in ours]
    p = [x["tokens_per_s"] for x in theirs]
    one = [r for r in rows if r["workload"] == w and r["dtype"] == d and r["threads"] == 1]
    f32 = [r for r in rows if r["workload"] == w and r["dtype"] == "f32" and r["threads"] == t] if d != "f32" else []
    return dict(workload=w, dtype=d, threads=t, ours=statistics.median(o), ours_min=min(o), ours_max=max(o),
                setting=setting, gain=statistics.median(o) / one[0]["ours"] if one and t > 1 else None,
                other_settings=", ".join(f"{k} {statistics.median(x['tokens_per_s'] for x in v):.0f}"
                                         for k, v in by_setting.items() if k != setting),
                torch=statistics.median(p), torch_min=min(p), torch_max=max(p),
                ratio=statistics.median(o) / statistics.median(p),
                # bf16 over f32 on each side, at the same thread count (each side at its best setting of each dtype)
                speedup_ours=statistics.median(o) / f32[0]["ours"] if f32 else None,
                speedup_torch=statistics.median(p) / f32[0]["torch"] if f32 else None,
                matmul_gflops=statistics.median(x["matmul_gflops"] for x in ours), sgemm_peak=peak,
                # The GEMMs' FLOP/s over threads x the core's peak for the dtype (lm_train's same-process loop)
                gemm_fraction=statistics.median(x.get("gemm_fraction_of_peak", float("nan")) for x in ours),
                # Model FLOP/s over threads x the core's peak for the dtype, both measured by lm_train in its run
                mfu=statistics.median(x.get("mfu", float("nan")) for x in ours),
                rss_ours=max(x["peak_rss_mb"] for x in ours),
                rss_torch=max(x["peak_rss_mb"] for x in theirs),
                allocs=ours[-1]["system_allocs_per_step"],
                # PyTorch 1.13 does not autocast nn.LSTM on the CPU: what its recurrence ran in
                torch_recurrence=theirs[0].get("recurrence_dtype", ""),
                spearman_ours=statistics.median(x.get("spearman", float("nan")) for x in ours),
                spearman_ref=statistics.median(x.get("spearman", float("nan")) for x in theirs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="gpt-s,gpt-m,rnn,lstm,sgns")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--dtype", default="f32",
                    help="f32, bf16 or both (f32,bf16): the language models' GEMM precision, bf16 being autocast on both sides")
    ap.add_argument("--learning-steps", type=int, default=500, help="steps of the same-learning check (0: skip)")
    ap.add_argument("--learning-workloads", default="gpt-s",
                    help="the workloads of the same-learning check, e.g. gpt-s,gpt-m,lstm")
    ap.add_argument("--wordsim", help="WordSim-353 file: adds the Spearman of both sgns runs")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory whose programs run")
    a = ap.parse_args()
    global LM_TRAIN, W2V
    LM_TRAIN, W2V = os.path.join(a.build, "bench", "lm_train"), os.path.join(a.build, "examples", "word2vec")
    workloads = a.workloads.split(",")
    dtypes = a.dtype.split(",")
    if not dtypes or any(d not in ("f32", "bf16") for d in dtypes) or len(set(dtypes)) != len(dtypes):
        sys.exit(f"compare: --dtype {a.dtype}: give f32, bf16 or f32,bf16")
    dtypes = [d for d in ("f32", "bf16") if d in dtypes]  # f32 first: a bf16 row's speedup reads the f32 row
    if "sgns" in workloads and "f32" not in dtypes:
        print("compare: sgns has no GEMMs and runs in float32 only: skipped (ask for --dtype f32,bf16 to include it)",
              file=sys.stderr)
        workloads.remove("sgns")
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
            # Per dtype: tapegrad's runs and the reference's by setting. Every repeat runs each dtype's pair in
            # turn, so a busy spell on the machine falls on both dtypes and both sides alike.
            runs = {d: ([], {}) for d in (["f32"] if w == "sgns" else dtypes)}
            for r in range(a.repeats):
                for d, (ours, by_setting) in runs.items():
                    o, ps = (sgns_pair(t, a, sentences) if w == "sgns"
                             else lm_pair(w, t, text, ["--steps", str(a.steps), "--dtype", d]))
                    ours.append(o)
                    for name, p in ps.items():
                        by_setting.setdefault(name, []).append(p)
                    unit = "words/s" if w == "sgns" else "tok/s"
                    print(f"{w} {d} threads={t} rep {r + 1}: tapegrad {o['tokens_per_s']:.0f} {unit}, "
                          + ", ".join(f"{name} {p['tokens_per_s']:.0f}" for name, p in ps.items()), file=sys.stderr)
            for d, (ours, by_setting) in runs.items():
                rows.append(summarise(w, d, t, ours, by_setting, peak, rows))
    os.makedirs(a.out, exist_ok=True)
    head = ("| workload | dtype | threads | tapegrad tok/s (min–max) | tapegrad n/1 threads "
            "| reference tok/s (min–max), best setting | ratio | matmul GFLOP/s | sgemm peak | matmul % of core peak "
            "| tapegrad MFU | RSS MiB tapegrad / reference | mallocs/step |\n"
            "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")

    def gemm(r):
        if r["workload"] == "sgns":
            return "– | " + f"{r['sgemm_peak']:.1f} | –"
        # Against the core's peak for the dtype, not the sgemm peak: float32 GEMMs may run on oneDNN, which
        # can pass OpenBLAS's peak, and the sgemm peak says nothing of a bfloat16 GEMM.
        share = "–" if r["gemm_fraction"] != r["gemm_fraction"] else f"{100 * r['gemm_fraction']:.0f}%"
        return f"{r['matmul_gflops']:.1f} | {r['sgemm_peak']:.1f} | {share}"

    def mfu(x):
        return "–" if x != x else f"{100 * x:.0f}%"  # NaN: sgns, or an lm_train without the field

    md = provenance() + head + "".join(
        f"| {r['workload']} | {r['dtype']} | {r['threads']} | {r['ours']:.0f} ({r['ours_min']:.0f}–{r['ours_max']:.0f}) "
        f"| {'–' if r['gain'] is None else format(r['gain'], '.2f') + '×'} "
        f"| {r['torch']:.0f} ({r['torch_min']:.0f}–{r['torch_max']:.0f}), {r['setting']}"
        f"{' (' + r['other_settings'] + ')' if r['other_settings'] else ''} | {r['ratio']:.2f}× "
        f"| {gemm(r)} | {mfu(r['mfu'])} | {r['rss_ours']:.0f} / {r['rss_torch']:.0f} | {r['allocs']} |\n" for r in rows)
    md += ("\nReference: PyTorch " + subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                                                  capture_output=True, text=True).stdout.strip()
           + " for the language models; gensim for sgns (words/s over raw words × epochs).\n")
    md += ("tapegrad MFU: the step's GEMM FLOPs a token (counted by lm_train's profiled pass, less attention's "
           "rebuilding of its probabilities in backward) times tokens/s, over "
           "threads × one core's peak for the dtype, measured in the same process (float32 FMAs, or bfloat16 dot "
           "products for bf16: bench/peak.h).\n")
    if "bf16" in dtypes:
        md += ("bf16: each step's forward and loss under autocast (tapegrad's AutocastGuard, PyTorch's "
               "torch.autocast(\"cpu\", dtype=torch.bfloat16)), float32 master weights on both sides.\n")
        fp32_recurrence = sorted({r["workload"] for r in rows if r["dtype"] == "bf16" and r["torch_recurrence"] == "float32"})
        if fp32_recurrence:
            md += (f"PyTorch's {', '.join(fp32_recurrence)} recurrence ran in float32 under autocast (PyTorch does not "
                   "autocast it on the CPU; its output head did run in bfloat16), tapegrad's in bfloat16.\n")
    both = [r for r in rows if r["speedup_ours"] is not None]
    if both:
        f32_of = lambda r: next(x for x in rows if (x["workload"], x["threads"], x["dtype"]) == (r["workload"], r["threads"], "f32"))
        md += ("\nbf16 against f32, medians at the same thread count (PyTorch at its best setting of each):\n\n"
               "| workload | threads | tapegrad tok/s f32 → bf16 | tapegrad bf16/f32 | tapegrad MFU f32 / bf16 "
               "| PyTorch tok/s f32 → bf16 | PyTorch bf16/f32 | RSS MiB tapegrad f32 / bf16 | RSS MiB PyTorch f32 / bf16 |\n"
               "|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
        md += "".join(
            f"| {r['workload']} | {r['threads']} | {f32_of(r)['ours']:.0f} → {r['ours']:.0f} | {r['speedup_ours']:.2f}× "
            f"| {mfu(f32_of(r)['mfu'])} / {mfu(r['mfu'])} "
            f"| {f32_of(r)['torch']:.0f} → {r['torch']:.0f} | {r['speedup_torch']:.2f}× "
            f"| {f32_of(r)['rss_ours']:.0f} / {r['rss_ours']:.0f} | {f32_of(r)['rss_torch']:.0f} / {r['rss_torch']:.0f} |\n"
            for r in both)
    sg = [r for r in rows if r["workload"] == "sgns" and r["spearman_ours"] == r["spearman_ours"]]
    for r in sg:
        md += (f"sgns threads={r['threads']}: WordSim-353 Spearman tapegrad {r['spearman_ours']:.4f}, "
               f"gensim {r['spearman_ref']:.4f} (diff {r['spearman_ours'] - r['spearman_ref']:+.4f})\n")
    if a.learning_steps > 0:
        # Same settings and seed on both sides, 2 threads (or the largest asked for): only the loss matters here.
        t = max(int(x) for x in a.threads.split(","))
        loss = {}  # (workload, dtype) -> (tapegrad, PyTorch) validation loss
        for w in a.learning_workloads.split(","):
            for d in dtypes:
                o, ps = lm_pair(w, t, text, ["--warmup", "0", "--steps", str(a.learning_steps), "--eval", "--dtype", d],
                                False)
                loss[w, d] = (o["val_loss"], next(iter(ps.values()))["val_loss"])
        md += (f"\nSame learning: {a.learning_steps} steps from the same settings and seed, "
               f"{t} thread{'s' if t > 1 else ''}, "
               "validation loss on 20 fixed batches (nats/char)"
               + (", bf16 being autocast on both sides" if "bf16" in dtypes else "") + ":\n\n")
        md += "| workload | dtype | tapegrad | PyTorch | tapegrad − PyTorch |" + (
            " tapegrad bf16 − f32 |" if len(dtypes) > 1 else "") + "\n"
        md += "|---|---|--:|--:|--:|" + ("--:|" if len(dtypes) > 1 else "") + "\n"
        for (w, d), (o, p) in loss.items():
            gap = f" {o - loss[w, 'f32'][0]:+.4f} |" if d == "bf16" and (w, "f32") in loss else (
                " – |" if len(dtypes) > 1 else "")
            md += f"| {w} | {d} | {o:.4f} | {p:.4f} | {o - p:+.4f} |{gap}\n"
    write_atomically(os.path.join(a.out, "compare.md"), md)
    write_atomically(os.path.join(a.out, "compare.csv"), ",".join(rows[0].keys()) + "\n" + "".join(
        ",".join(str(v) for v in r.values()) + "\n" for r in rows))
    print(md)
    print(f"wrote {a.out}/compare.md and compare.csv")


if __name__ == "__main__":
    main()
