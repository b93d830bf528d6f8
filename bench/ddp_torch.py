#!/usr/bin/env python3
"""PyTorch DistributedDataParallel (gloo) on the language-model workloads:
the reference for `mpirun -np N build/bench/lm_train` (bench/dist_compare.py
runs both).

Starts --procs processes on this machine (torch.multiprocessing, gloo over
loopback TCP), each with --threads threads; the models, optimizers and data
are bench/torch_lm.py's. As lm_train under MPI, every rank draws the whole
batch B from the same generator and trains on its B/N rows, and tokens/s
counts B*T tokens a step. Rank 0 prints one JSON line.

    /usr/bin/python3 bench/ddp_torch.py --workload gpt-s --text-dir out/bench/text --procs 2 --threads 1
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from peak_rss import peak_rss_mib
from torch_lm import GPT, RNNLM, WORKLOADS


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, a, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.procs)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    w = WORKLOADS[a.workload]
    train = open(f"{a.text_dir}/train.txt", encoding="utf-8").read()
    val = open(f"{a.text_dir}/val.txt", encoding="utf-8").read()
    chars = sorted(set(train + val))
    stoi = {c: i for i, c in enumerate(chars)}
    tr = torch.tensor([stoi[c] for c in train], dtype=torch.long)
    V, T, B = len(chars), w["block"], w["batch"]
    if B % a.procs:
        raise SystemExit(f"ddp_torch: {a.workload}'s batch of {B} does not split over {a.procs} processes")
    if w["kind"] == "gpt":
        model = GPT(V, w["layers"], w["heads"], w["dim"], T)
    else:
        model = RNNLM(V, w["kind"], w["embed"], w["hidden"])
    ddp = DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)  # broadcasts rank 0's parameters
    if w["kind"] == "gpt":
        decay = [p for p in model.parameters() if p.dim() >= 2]
        other = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(a.seed)
    rows = slice(rank * B // a.procs, (rank + 1) * B // a.procs)

    def step():
        off = torch.randint(0, len(tr) - T - 1, (B,), generator=g)[rows]
        x = torch.stack([tr[o:o + T] for o in off])
        y = torch.stack([tr[o + 1:o + T + 1] for o in off])
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x).reshape(-1, V), y.reshape(-1))
        loss.backward()  # DDP's hooks allreduce the gradient buckets during backward
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    secs = time.perf_counter() - t0
    mean_loss = torch.tensor([loss])
    dist.all_reduce(mean_loss)
    if rank == 0:
        print(json.dumps(dict(side="pytorch-ddp", workload=a.workload, threads=a.threads, ranks=a.procs,
                              steps=a.steps, tokens_per_s=a.steps * B * T / secs,
                              last_loss=mean_loss.item() / a.procs, peak_rss_mb=peak_rss_mib(),
                              bucket_mb=a.bucket_mb)), flush=True)
    # Leave without tearing down: in PyTorch 1.13 the process group's
    # destructor sometimes waits forever for its peer's threads (seen here
    # after the result was printed), and nothing is left to clean up.
    dist.barrier()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--text-dir", required=True)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--bucket-mb", type=float, default=25, help="DDP bucket_cap_mb (PyTorch's default 25)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    mp.spawn(worker, args=(a, free_port()), nprocs=a.procs, join=True)


if __name__ == "__main__":
    main()
