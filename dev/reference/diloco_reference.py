#!/usr/bin/env python3
"""DiLoCo reference (Douillard et al. 2023), independent of the C++ code: N ranks simulated in one process, each
with its own torch.optim.AdamW on its own copy of the weights (inner steps, gradient clipped by
torch.nn.utils.clip_grad_norm_ semantics), and one torch.optim.SGD(nesterov=True) on the global weights (outer
step) whose .grad is the mean over ranks of global - local, at steps divisible by H.

The pseudo-gradient's wire (llmc/optim/diloco/diloco.h):
  fp32  mean = (sum over ranks in rank order) * (1/W), in float32
  bf16  every rank's delta rounded to bf16, partial sums rounded to bf16 in rank order, then * (1/W); at W = 1
        nothing is rounded (a one-rank all-reduce sends nothing)
  int8  per tensor, blocks of 4096 elements: s = absmax / 127, q = clip(rint(x / s), -127, 127) (q = 0 where s = 0),
        mean = (sum over ranks in rank order of q * s) * (1/W), float32, at every W
The int8 codec here is a plain numpy transcription of that text.

Usage: diloco_reference.py CASE_DIR...  Each CASE_DIR holds meta.json, init.bin (float32 params) and grads.bin
(float32, steps x ranks x n); writes expected.bin (float32, per step: every rank's local weights, the global
weights, the averaged pseudo-gradient of that step (zeros off sync steps)).
"""
import json
import os
import sys

import numpy as np
import torch

INT8_BLOCK = 4096


def int8_roundtrip(x, sizes):
    """A rank's pseudo-gradient after the int8 wire: quantized per block, dequantized."""
    out = np.zeros_like(x)
    off = 0
    for numel in sizes:
        for lo in range(0, numel, INT8_BLOCK):
            hi = min(numel, lo + INT8_BLOCK)
            v = x[off + lo:off + hi]
            s = np.float32(np.max(np.abs(v))) / np.float32(127.0)
            if s > 0:
                q = np.clip(np.rint(v / s), -127, 127).astype(np.float32)
            else:
                q = np.zeros_like(v)
            out[off + lo:off + hi] = q * np.float32(s)
        off += numel
    return out


def mean_over_ranks(deltas, wire, sizes):
    w = len(deltas)
    inv = np.float32(1.0) / np.float32(w)
    if wire == "fp32":
        s = deltas[0].copy()
        for d in deltas[1:]:
            s = (s + d).astype(np.float32)
        return (s * inv).astype(np.float32)
    if wire == "bf16":
        if w == 1:
            return deltas[0].copy()
        s = torch.from_numpy(deltas[0]).to(torch.bfloat16)
        for d in deltas[1:]:
            s = (s.float() + torch.from_numpy(d).to(torch.bfloat16).float()).to(torch.bfloat16)
        return (s.float().numpy() * inv).astype(np.float32)
    assert wire == "int8", wire
    s = int8_roundtrip(deltas[0], sizes)
    for d in deltas[1:]:
        s = (s + int8_roundtrip(d, sizes)).astype(np.float32)
    return (s * inv).astype(np.float32)


def run_case(case):
    meta = json.load(open(os.path.join(case, "meta.json")))
    w, steps, h = meta["ranks"], meta["steps"], meta["inner_steps"]
    shapes, decays = meta["shapes"], meta["decays"]
    sizes = [int(np.prod(s)) for s in shapes]
    n = sum(sizes)
    init = np.fromfile(os.path.join(case, "init.bin"), dtype=np.float32)
    grads = np.fromfile(os.path.join(case, "grads.bin"), dtype=np.float32).reshape(steps, w, n)
    assert init.size == n

    def tensors(flat):
        out, off = [], 0
        for s, k in zip(shapes, sizes):
            out.append(torch.nn.Parameter(torch.from_numpy(flat[off:off + k].copy()).reshape(s)))
            off += k
        return out

    def flat(ps):
        return np.concatenate([p.detach().reshape(-1).numpy() for p in ps]).astype(np.float32)

    glob = tensors(init)
    outer = torch.optim.SGD(glob, lr=meta["outer_lr"], momentum=meta["outer_momentum"], nesterov=True)
    local, inner = [], []
    for _ in range(w):
        ps = tensors(init)
        groups = [{"params": [p for p, d in zip(ps, decays) if d], "weight_decay": meta["weight_decay"]},
                  {"params": [p for p, d in zip(ps, decays) if not d], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        local.append(ps)
        inner.append(torch.optim.AdamW(groups, lr=meta["lrs"][0], betas=(meta["beta1"], meta["beta2"]),
                                       eps=meta["eps"], foreach=False))
    rows = []
    for step in range(steps):
        for r in range(w):
            off = 0
            for p, k in zip(local[r], sizes):
                p.grad = torch.from_numpy(grads[step, r, off:off + k].copy()).reshape(p.shape)
                off += k
            if meta["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(local[r], meta["grad_clip"])
            for g in inner[r].param_groups:
                g["lr"] = meta["lrs"][step]
            inner[r].step()
        mean = np.zeros(n, dtype=np.float32)
        if (step + 1) % h == 0:
            g0 = flat(glob)
            mean = mean_over_ranks([(g0 - flat(local[r])).astype(np.float32) for r in range(w)], meta["wire"], sizes)
            off = 0
            for p, k in zip(glob, sizes):
                p.grad = torch.from_numpy(mean[off:off + k].copy()).reshape(p.shape)
                off += k
            outer.step()
            with torch.no_grad():
                for r in range(w):
                    for p, q in zip(local[r], glob):
                        p.copy_(q)
        for r in range(w):
            rows.append(flat(local[r]))
        rows.append(flat(glob))
        rows.append(mean)
    np.concatenate(rows).astype(np.float32).tofile(os.path.join(case, "expected.bin"))


def main():
    torch.set_num_threads(1)
    for case in sys.argv[1:]:
        run_case(case)
    print(f"diloco_reference: {len(sys.argv) - 1} case(s) written")


if __name__ == "__main__":
    main()
