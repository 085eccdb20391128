#!/usr/bin/python3
"""Independent Signum-with-majority-vote reference for testing the C++ optimizer (llmc/optim/signum/signum.cpp).

Written from the algorithm of Bernstein et al. 2018 ("signSGD: compressed optimisation for non-convex problems",
Signum with majority vote), sharing no code with the C++ side. N ranks are simulated in one process with dense
float32 torch tensors, per tensor; every rank applies the same vote, so the parameters are kept once. Per step,
for every rank r:

  g_r = r's gradient * min(1, grad_clip / (||g_r|| + 1e-6))   (its own L2 norm over all tensors, in float64;
                                                               grad_clip <= 0: no clipping)
  m_r = beta * m_r + (1 - beta) * g_r
  s_r = +1 where m_r >= 0, -1 where m_r < 0                   (one bit per element: zero counts as +1)
then, for all ranks at once:
  vote = sign(sum over ranks of s_r)                          (0 on a tie, which only an even world has)
  p = p * (1 - lr * weight_decay)   on the decayed tensors ("matrices": the 2-D ones; "all": every tensor)
  p = p - lr * vote

Usage: signum_reference.py CASE [CASE ...]   (reads CASE.json and CASE.bin, writes CASE.out)
  CASE.json: {"ranks", "steps", "shapes", "lr": [per step], "beta", "weight_decay", "grad_clip",
              "decay_groups": "all"|"matrices"}
  CASE.bin:  float32 initial parameters (all tensors flat, in order), then for each step, for each rank, that
             rank's gradient (same layout).
  CASE.out:  for each step: the parameters after it, then each rank's momentum; float32 in the parameter layout.
Prints, per case, how many votes were ties.
"""
import json
import math
import sys

import numpy as np
import torch


def split(flat, shapes):
    out, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(torch.from_numpy(flat[at:at + n].copy()).reshape(shape))
        at += n
    return out


def flat(tensors):
    return np.concatenate([t.reshape(-1).numpy() for t in tensors]).astype(np.float32)


def run_case(case_json, case_bin, out_bin):
    with open(case_json) as f:
        cfg = json.load(f)
    shapes, ranks, steps = [tuple(s) for s in cfg["shapes"]], cfg["ranks"], cfg["steps"]
    n = sum(math.prod(s) for s in shapes)
    data = np.fromfile(case_bin, dtype=np.float32)
    assert data.size == n * (1 + steps * ranks), f"{case_bin}: {data.size} floats, expected {n * (1 + steps * ranks)}"
    beta, wd, clip = cfg["beta"], cfg["weight_decay"], cfg["grad_clip"]
    # the C++ side's float32 inputs, as Python floats
    beta = float(np.float32(beta))
    wd = float(np.float32(wd))
    clip = float(np.float32(clip))
    decays = [cfg["decay_groups"] == "all" or len(s) == 2 for s in shapes]
    params = split(data[:n], shapes)
    momentum = [[torch.zeros(s, dtype=torch.float32) for s in shapes] for _ in range(ranks)]
    one_minus_beta = torch.tensor(1.0 - beta, dtype=torch.float32)
    ties = 0
    out = []
    for step in range(steps):
        lr = float(np.float32(cfg["lr"][step]))
        signs = []
        for r in range(ranks):
            at = n * (1 + step * ranks + r)
            grads = split(data[at:at + n], shapes)
            norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
            coef = clip / (norm + 1e-6)
            if clip > 0 and coef < 1:
                scale = torch.tensor(coef, dtype=torch.float32)
                grads = [g * scale for g in grads]
            rank_signs = []
            for m, g in zip(momentum[r], grads):
                m.copy_(m * torch.tensor(beta, dtype=torch.float32) + g * one_minus_beta)
                rank_signs.append(torch.where(m < 0, -1, 1).to(torch.int32))
            signs.append(rank_signs)
        for t, p in enumerate(params):
            total = sum(signs[r][t] for r in range(ranks))
            vote = torch.sign(total).to(torch.float32)
            ties += int((total == 0).sum())
            if decays[t] and wd != 0:
                p.mul_(torch.tensor(1.0 - lr * wd, dtype=torch.float32))
            p.sub_(vote * torch.tensor(lr, dtype=torch.float32))
        out.append(flat(params))
        for r in range(ranks):
            out.append(flat(momentum[r]))
    np.concatenate(out).astype(np.float32).tofile(out_bin)
    return ties


def main():
    torch.set_num_threads(1)
    for case in sys.argv[1:]:
        ties = run_case(case + ".json", case + ".bin", case + ".out")
        print(f"{case.rsplit('/', 1)[-1]}: {ties} tied votes")


if __name__ == "__main__":
    main()
