#!/usr/bin/env python3
"""PowerSGD reference (Vogels et al. 2019, as PyTorch's DDP powerSGD_hook runs it), independent of the C++ code:
W ranks simulated in one process by lists of per-rank gradients, then torch.nn.utils.clip_grad_norm_ and
torch.optim.AdamW on the averaged approximation, which is the same on every rank.

The rule (llmc/optim/powersgd/powersgd.h): a 2-D tensor n x m is compressed when k (n + m) < n m, k = min(n, m, r).
Per compressed tensor on rank i: M_i = g_i + e_i; Q = orth(Q) (Q drawn on the first step, or every step without
warm start); P_i = M_i Q. P = mean of P_i. P = orth(P); Q_i = M_i^T P. Q = mean of Q_i (kept for the next step).
g_hat = P Q^T; e_i = M_i - g_hat. The other tensors: g_hat = mean of g_i. A mean is (sum in rank order) * (1/W) in
float32. orth: Gram-Schmidt over the columns in order, x_i /= ||x_i|| + 1e-8, then x_c -= (x_i . x_c) x_i for the
later columns (torch's _orthogonalize_gram_schmidt). The starting Q: the counter-based normal draw of powersgd.h,
transcribed here from that text with numpy's wrapping uint64 arithmetic.

Usage: powersgd_reference.py CASE_DIR...  Each CASE_DIR holds meta.json, init.bin (float32 params) and grads.bin
(float32, steps x ranks x n); writes expected.bin (float32, per step: the weights, g_hat before clipping, then
every rank's error buffer e, zero outside the compressed tensors).
"""
import json
import math
import os
import sys

import numpy as np
import torch

EPS_ORTH = 1e-8
M64 = (1 << 64) - 1


def splitmix(x):
    """splitmix64's output function of x + golden gamma, on a uint64 numpy array (wrapping)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def draw_q(seed, d, tensor, rows, k):
    with np.errstate(over="ignore"):
        s = splitmix(np.array([seed], dtype=np.uint64))
        key = splitmix(s ^ np.array([((d << 32) | tensor) & M64], dtype=np.uint64))[0]
        j = np.arange(rows * k, dtype=np.uint64)
        a = splitmix(key + np.uint64(2) * j)
        b = splitmix(key + np.uint64(2) * j + np.uint64(1))
    u1 = ((a >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0 ** -53
    u2 = (b >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
    return torch.from_numpy(z.astype(np.float32).reshape(rows, k))


def orth(x):
    """Gram-Schmidt over the columns of a float32 matrix, in place, as torch's _orthogonalize_gram_schmidt."""
    k = x.shape[1]
    for i in range(k):
        col = x[:, i:i + 1]
        col /= torch.norm(col) + EPS_ORTH
        if i + 1 < k:
            rest = x[:, i + 1:]
            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col
    return x


def mean(tensors):
    s = tensors[0].clone()
    for t in tensors[1:]:
        s = s + t
    return s * (torch.tensor(1.0, dtype=torch.float32) / len(tensors))


def run_case(case):
    meta = json.load(open(os.path.join(case, "meta.json")))
    w, steps, r = meta["ranks"], meta["steps"], meta["rank"]
    shapes, decays = meta["shapes"], meta["decays"]
    sizes = [int(np.prod(s)) for s in shapes]
    offsets = np.cumsum([0] + sizes)
    n = int(offsets[-1])
    init = np.fromfile(os.path.join(case, "init.bin"), dtype=np.float32)
    grads = np.fromfile(os.path.join(case, "grads.bin"), dtype=np.float32).reshape(steps, w, n)
    assert init.size == n

    params = [torch.nn.Parameter(torch.from_numpy(init[offsets[i]:offsets[i + 1]].copy()).reshape(s))
              for i, s in enumerate(shapes)]
    groups = [{"params": [p for p, d in zip(params, decays) if d], "weight_decay": meta["weight_decay"]},
              {"params": [p for p, d in zip(params, decays) if not d], "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=meta["lrs"][0],
                            betas=(meta["beta1"], meta["beta2"]), eps=meta["eps"], foreach=False)
    compressed = {}
    for i, s in enumerate(shapes):
        if len(s) == 2:
            k = min(s[0], s[1], r)
            if k * (s[0] + s[1]) < s[0] * s[1]:
                compressed[i] = k
    errors = [[torch.zeros(s) for s in shapes] for _ in range(w)]
    qs = {}
    rows = []
    for step in range(steps):
        g = [[torch.from_numpy(grads[step, rank, offsets[i]:offsets[i + 1]].copy()).reshape(s)
              for i, s in enumerate(shapes)] for rank in range(w)]
        g_hat = []
        for i, s in enumerate(shapes):
            if i not in compressed:
                g_hat.append(mean([g[rank][i] for rank in range(w)]))
                continue
            k = compressed[i]
            ms = [g[rank][i] + errors[rank][i] for rank in range(w)]
            if step == 0 or not meta["warm_start"]:
                qs[i] = draw_q(meta["seed"], 0 if meta["warm_start"] else step, i, s[1], k)
            q = orth(qs[i])
            p = orth(mean([mi @ q for mi in ms]))
            q = mean([mi.t() @ p for mi in ms])
            qs[i] = q
            approx = p @ q.t()
            for rank in range(w):
                errors[rank][i] = ms[rank] - approx
            g_hat.append(approx)
        for p, gh in zip(params, g_hat):
            p.grad = gh.clone()
        if meta["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, meta["grad_clip"])
        for group in opt.param_groups:
            group["lr"] = meta["lrs"][step]
        opt.step()
        rows.append(np.concatenate([p.detach().reshape(-1).numpy() for p in params]))
        rows.append(np.concatenate([t.reshape(-1).numpy() for t in g_hat]))
        for rank in range(w):
            rows.append(np.concatenate([t.reshape(-1).numpy() for t in errors[rank]]))
    np.concatenate(rows).astype(np.float32).tofile(os.path.join(case, "expected.bin"))


def main():
    torch.set_num_threads(1)
    for case in sys.argv[1:]:
        run_case(case)
    print(f"powersgd_reference: {len(sys.argv) - 1} case(s) written")


if __name__ == "__main__":
    main()
