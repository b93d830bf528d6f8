#!/usr/bin/env python3
"""The PyTorch side of the language-model comparison (bench/compare.py).

Trains one workload exactly as bench/lm_train (the tapegrad side) does and
prints one JSON line: steady-state tokens/s, peak RSS and, with --eval, the
validation loss after the run. Both sides read the same train.txt / val.txt
(written by `lm_train --write-text DIR`) and build the same character
vocabulary (sorted distinct characters of both files).

--dtype bf16 runs each step's forward and loss (and the evaluation) under
torch.autocast("cpu", dtype=torch.bfloat16), as `lm_train --dtype bf16` runs
tapegrad's under AutocastGuard; parameters, gradients and the optimizer stay
float32 on both sides. What autocast rounds is PyTorch's choice: its GEMMs,
and in 1.13 also the ops that take their bfloat16 outputs (softmax, GELU);
nn.LSTM is not autocast on the CPU in 1.13 and keeps its recurrence float32.
The JSON line says what ran: "dtype", and for the recurrent models
"recurrence_dtype", the dtype of the recurrence's output.

Workloads (bench/workloads.h): fp32 weights, AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight decay 0.01 on matrices only, constant LR, no dropout, no clipping.
  gpt-s  2 layers, 4 heads, d 128, block 64, batch 32
  gpt-m  4 layers, 4 heads, d 256, block 128, batch 16
  rnn    embedding 64, hidden 256, tanh, seq 64, batch 32, Adam lr 2e-3
  lstm   embedding 64, hidden 256, seq 64, batch 32, Adam lr 2e-3
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from peak_rss import peak_rss_mib

WORKLOADS = {
    "gpt-s": dict(kind="gpt", layers=2, heads=4, dim=128, block=64, batch=32),
    "gpt-m": dict(kind="gpt", layers=4, heads=4, dim=256, block=128, batch=16),
    "rnn": dict(kind="rnn", embed=64, hidden=256, block=64, batch=32),
    "lstm": dict(kind="lstm", embed=64, hidden=256, block=64, batch=32),
}


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.h)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, V, layers, heads, dim, block):
        super().__init__()
        self.wte = nn.Embedding(V, dim)
        self.wpe = nn.Embedding(block, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        for name, p in self.named_parameters():
            if "ln" in name:
                continue
            if p.dim() < 2:
                nn.init.zeros_(p)
            elif name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


class RNNLM(nn.Module):
    def __init__(self, V, kind, embed, hidden):
        super().__init__()
        self.embedding = nn.Embedding(V, embed)
        cls = nn.LSTM if kind == "lstm" else nn.RNN
        self.rnn = cls(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, V)

    def forward(self, idx):
        out, _ = self.rnn(self.embedding(idx))
        return self.head(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--text-dir", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eval", action="store_true", help="report the validation loss on 20 fixed batches after the run")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"],
                    help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16), float32 master weights")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    w = WORKLOADS[a.workload]
    train = open(f"{a.text_dir}/train.txt", encoding="utf-8").read()
    val = open(f"{a.text_dir}/val.txt", encoding="utf-8").read()
    chars = sorted(set(train + val))
    stoi = {c: i for i, c in enumerate(chars)}
    tr = torch.tensor([stoi[c] for c in train], dtype=torch.long)
    va = torch.tensor([stoi[c] for c in val], dtype=torch.long)
    V, T, B = len(chars), w["block"], w["batch"]
    if w["kind"] == "gpt":
        model = GPT(V, w["layers"], w["heads"], w["dim"], T)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        other = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    else:
        model = RNNLM(V, w["kind"], w["embed"], w["hidden"])
        opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(a.seed)

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def step():
        off = torch.randint(0, len(tr) - T - 1, (B,), generator=g)
        x = torch.stack([tr[o:o + T] for o in off])
        y = torch.stack([tr[o + 1:o + T + 1] for o in off])
        opt.zero_grad(set_to_none=True)  # before forward, as tapegrad's step: no stale grads at the peak
        with autocast():  # forward and loss only, as the autocast docs say; backward follows the recorded dtypes
            loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    secs = time.perf_counter() - t0
    out = dict(side="pytorch", workload=a.workload, dtype=a.dtype, threads=a.threads, steps=a.steps,
               tokens_per_s=a.steps * B * T / secs, last_loss=loss,
               peak_rss_mb=peak_rss_mib())
    if w["kind"] != "gpt":
        # What the recurrence computed in, probed after the timing (PyTorch 1.13 leaves nn.LSTM float32 under autocast).
        with torch.no_grad(), autocast():
            h = model.rnn(model.embedding(tr[:T].unsqueeze(0)))[0]
        out["recurrence_dtype"] = str(h.dtype).replace("torch.", "")
    if a.eval:
        model.eval()
        with torch.no_grad(), autocast():
            n, count = 20, 20 * B
            stride = (len(va) - T - 1) / max(1, count - 1)
            offs = [int(i * stride) for i in range(count)]
            tot = 0.0
            for i in range(n):
                o = offs[i * B:(i + 1) * B]
                x = torch.stack([va[k:k + T] for k in o])
                y = torch.stack([va[k + 1:k + T + 1] for k in o])
                tot += F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1)).item()
        out["val_loss"] = tot / n
    print(json.dumps(out))


if __name__ == "__main__":
    main()
