#!/usr/bin/env python3
"""The PyTorch side of bench/compare_hvp.py: the median time of one gradient
and of a Hessian-vector product on a workload's model (the models of
bench/torch_lm.py, random tokens), printed as one JSON line.

hvp_s is the double-backward product (grad of g . v, as tapegrad's
bench/hvp does); functional_hvp_s is torch.autograd.functional.hvp on the
same loss as a function of all parameters; functorch_hvp_s is functorch's
forward over reverse, jvp(grad(loss)), or null where PyTorch cannot run it
(1.13's forward mode has no formula for some backward ops, e.g.
native_layer_norm_backward; functorch_error says which).
"""
import argparse
import json
import time

import functorch
import torch
import torch.nn.functional as F
from torch.nn.utils import stateless

from torch_lm import GPT, RNNLM, WORKLOADS


def median_seconds(reps, f):
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return sorted(t)[len(t) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="gpt-s", choices=sorted(WORKLOADS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    w, V = WORKLOADS[a.workload], 85
    if w["kind"] == "gpt":
        model = GPT(V, w["layers"], w["heads"], w["dim"], w["block"])
    else:
        model = RNNLM(V, w["kind"], w["embed"], w["hidden"])
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, V, (w["batch"], w["block"]), generator=g)
    y = torch.randint(0, V, (w["batch"], w["block"]), generator=g)
    v = [torch.randn(p.shape, generator=g) for p in params]

    def loss_of(*ps):
        out = stateless.functional_call(model, dict(zip(names, ps)), (x,))
        return F.cross_entropy(out.reshape(-1, V), y.reshape(-1))

    def gradient():
        return torch.autograd.grad(loss_of(*params), params)

    def hvp():
        gs = torch.autograd.grad(loss_of(*params), params, create_graph=True)
        gv = sum((gi * vi).sum() for gi, vi in zip(gs, v))
        return torch.autograd.grad(gv, params)

    def functional_hvp():
        return torch.autograd.functional.hvp(loss_of, tuple(p.detach() for p in params), tuple(v))

    def functorch_hvp():
        return functorch.jvp(functorch.grad(lambda ps: loss_of(*ps)), (tuple(p.detach() for p in params),),
                             (tuple(v),))[1]

    gradient(), hvp(), functional_hvp()
    t_grad = median_seconds(a.reps, gradient)
    t_hvp = median_seconds(a.reps, hvp)
    t_fhvp = median_seconds(a.reps, functional_hvp)
    t_ft, ft_error = None, None
    try:
        functorch_hvp()
        t_ft = median_seconds(a.reps, functorch_hvp)
    except (NotImplementedError, RuntimeError) as e:
        ft_error = str(e).splitlines()[0]
    print(json.dumps(dict(side="pytorch", workload=a.workload, threads=a.threads,
                          params=sum(p.numel() for p in params), grad_s=t_grad, hvp_s=t_hvp,
                          hvp_over_grad=t_hvp / t_grad, functional_hvp_s=t_fhvp, functorch_hvp_s=t_ft,
                          functorch_error=ft_error)))


if __name__ == "__main__":
    main()
