#!/usr/bin/env python3
"""Activation checkpointing: peak memory and time per step, with and without.

Runs build/bench/lm_train on each configuration with and without
--checkpoint, alternating, for several rounds, and prints a Markdown table of
medians: the allocator's peak (weights, gradients and optimizer state
included), that peak above what is held between steps (the activations), the
process's peak RSS, and seconds per step with the spread over the rounds.
The two runs of a round must end on the same loss (checkpointing changes no
number); a difference is an error.

    /usr/bin/python3 bench/compare_checkpoint.py --rounds 3
    /usr/bin/python3 bench/compare_checkpoint.py --out doc/bench/checkpoint.md   # the file the docs link

With --out it also writes the table to a Markdown file, headed by the date,
the machine, the commit and the command.
"""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import publish, run  # noqa: E402

# workload, T, B: GPT-M at a context of 1024 and 4096 (the same tokens a
# step), the LSTM at 4096.
CONFIGS = [("gpt-m", 1024, 16), ("gpt-m", 4096, 4), ("lstm", 4096, 8)]



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--text-dir", default=os.path.join(HERE, "..", "out", "bench", "text"),
                    help="lm_train's text (lm_train --write-text DIR writes it)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="also write the table to this Markdown file")
    a = ap.parse_args()
    rows = []
    for w, T, B in CONFIGS:
        runs = {False: [], True: []}
        for r in range(a.rounds):
            for ck in (False, True):
                print(f"compare_checkpoint: {w} T={T} B={B} round {r + 1}/{a.rounds}{' checkpointed' if ck else ''}",
                      file=sys.stderr)
                runs[ck].append(run([os.path.join(a.build, "bench", "lm_train"), "--workload", w, "--threads",
                                     str(a.threads), "--seq-len", str(T), "--batch", str(B), "--warmup", "1", "--steps",
                                     str(a.steps), "--text-dir", a.text_dir] + (["--checkpoint"] if ck else [])))
            if runs[False][-1]["last_loss"] != runs[True][-1]["last_loss"]:
                sys.exit(f"compare_checkpoint: {w} T={T}: loss {runs[False][-1]['last_loss']} plain, "
                         f"{runs[True][-1]['last_loss']} checkpointed")
        keys = ("pool_peak_mb", "step_peak_mb", "peak_rss_mb", "seconds_per_step")
        rows.append(dict(w=w, T=T, B=B,
                         med={(ck, k): statistics.median(x[k] for x in runs[ck]) for ck in runs for k in keys},
                         span={ck: (min(x["seconds_per_step"] for x in runs[ck]),
                                    max(x["seconds_per_step"] for x in runs[ck])) for ck in runs}))
    lines = [f"Activation checkpointing (`lm_train --checkpoint`), {a.threads} thread(s), {a.steps} timed steps after "
             f"one warm-up, medians of {a.rounds} alternating rounds; MiB of the allocator, MB of RSS:", "",
             "| workload | T × B | peak, plain → checkpointed | activations (peak above what steps hold) "
             "| peak RSS | s/step (min–max) | time |",
             "|---|---|--:|--:|--:|--:|--:|"]
    for r in rows:
        m, s = lambda ck, k: r["med"][(ck, k)], lambda ck: r["span"][ck]
        ratio = lambda k: f"{m(False, k):.1f} → {m(True, k):.1f} ({m(False, k) / m(True, k):.2f}× lower)"
        lines.append(
            f"| {r['w']} | {r['T']} × {r['B']} | {ratio('pool_peak_mb')} | {ratio('step_peak_mb')} | "
            f"{m(False, 'peak_rss_mb'):.0f} → {m(True, 'peak_rss_mb'):.0f} | "
            f"{m(False, 'seconds_per_step'):.2f} ({s(False)[0]:.2f}–{s(False)[1]:.2f}) → "
            f"{m(True, 'seconds_per_step'):.2f} ({s(True)[0]:.2f}–{s(True)[1]:.2f}) | "
            f"+{100 * (m(True, 'seconds_per_step') / m(False, 'seconds_per_step') - 1):.0f}% |")
    publish("\n".join(lines) + "\n", a.out)


if __name__ == "__main__":
    main()
