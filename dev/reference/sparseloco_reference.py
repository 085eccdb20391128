#!/usr/bin/env python3
"""SparseLoCo reference (Sarfi et al. 2025; templar's TopKCompressor), independent of the C++ code: N ranks simulated
in one process. Each rank takes torch.optim.AdamW inner steps on its own copy of the weights (gradient clipped with
torch.nn.utils.clip_grad_norm_ semantics); at steps divisible by H each rank forms delta = global - local and

  e = ef_decay * e + delta                              (float32)
  per tensor, the tensor seen as rows x cols (1-D: one row), cut into n1 x n2 chunks, n = the largest divisor of the
  dimension <= chunk (1-D: n1 = 1); per chunk the k = min(topk, n1 n2) entries of largest |e| (a stable sort: ties
  to the lower index), listed in ascending index
  2bit values, per tensor over its selected values v (chunk order, ascending index):
      shift = mean(v) (float64, then float32), c = float32(v - shift),
      std = sqrt(sum c^2 / (m - 1)) (float64, then float32; 0 for m = 1), scale = float32(6 std) / 4 (1 if 0),
      q = clip(rint(float32(c / scale) + 2), 0, 3), lookup[b] = mean of c where q = b (float64 -> float32; 0 if
      none), sent value = float32(lookup[q] + shift)
  fp32 values: v as is
  e -= the sent values (at their positions)
  per tensor: norm_r = L2 norm of rank r's sent values (float64 -> float32), med = torch.median(norms) (the lower
  middle value), factor_r = torch.clamp(med / (norm_r + 1e-8), max=1) (float32)
  mean = (sum over ranks in rank order of factor_r * sent_r, dense, float32) * float32(1 / W)

and one torch.optim.SGD(nesterov=True) step on the global weights with .grad = mean; the local weights restart from
the global ones.

Usage: sparseloco_reference.py CASE_DIR...  Each CASE_DIR holds meta.json and, unless meta has "bytes_only",
init.bin (float32) and grads.bin (float32, steps x ranks x n). Writes message_bytes.txt (one rank's message:
5 float32 codebook entries per tensor for 2bit, 2 bits or 4 bytes per sent value, 12 bits per sent index rounded up
to whole pairs of 3 bytes) and expected.bin (float32, per step: every rank's local weights, the global weights, the
averaged pseudo-gradient of that step, zeros off sync steps).
"""
import json
import math
import os
import sys

import numpy as np
import torch


def chunk_len(size, chunk):
    if size <= chunk:
        return size
    for d in range(chunk, 1, -1):
        if size % d == 0:
            return d
    return 1


class Chunks:
    """One tensor's chunk plan: its flat values <-> [chunks, n1 * n2]."""

    def __init__(self, shape, chunk, topk):
        self.rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        self.cols = shape[-1]
        self.n1 = 1 if len(shape) == 1 else chunk_len(self.rows, chunk)
        self.n2 = chunk_len(self.cols, chunk)
        self.k = min(topk, self.n1 * self.n2)
        self.chunks = (self.rows // self.n1) * (self.cols // self.n2)

    def split(self, flat):
        return (flat.reshape(self.rows // self.n1, self.n1, self.cols // self.n2, self.n2)
                .transpose(0, 2, 1, 3).reshape(-1, self.n1 * self.n2))

    def join(self, ch):
        return (ch.reshape(self.rows // self.n1, self.cols // self.n2, self.n1, self.n2)
                .transpose(0, 2, 1, 3).reshape(-1))


def message_bytes(plans, two_bit):
    slots = sum(p.chunks * p.k for p in plans)
    values = (slots + 3) // 4 if two_bit else 4 * slots
    return (5 * 4 * len(plans) if two_bit else 0) + values + 3 * ((slots + 1) // 2)


def quantize_2bit(v):
    """templar's _quantize_values with 4 bins over 6 sigma, then its dequantization."""
    m = v.size
    shift = np.float32(v.astype(np.float64).mean())
    c = (v - shift).astype(np.float32)
    std = np.float32(math.sqrt(float((c.astype(np.float64) ** 2).sum()) / (m - 1))) if m > 1 else np.float32(0)
    scale = np.float32(np.float32(6.0) * std) / np.float32(4.0)
    if scale == 0 or not np.isfinite(scale):
        scale = np.float32(1.0)
    q = np.clip(np.rint((c / scale).astype(np.float32) + np.float32(2.0)), 0, 3).astype(np.int64)
    lookup = np.zeros(4, dtype=np.float32)
    for b in range(4):
        if (q == b).any():
            lookup[b] = np.float32(c[q == b].astype(np.float64).mean())
    return (lookup[q] + shift).astype(np.float32)


def compress(e, plan, two_bit):
    """The sent values of one tensor's error feedback e (flat), dense (zeros where nothing is sent)."""
    ch = plan.split(e)
    order = np.argsort(-np.abs(ch), axis=1, kind="stable")[:, :plan.k]
    sel = np.sort(order, axis=1)
    vals = np.take_along_axis(ch, sel, axis=1).reshape(-1)
    if two_bit:
        vals = quantize_2bit(vals)
    out = np.zeros_like(ch)
    np.put_along_axis(out, sel, vals.reshape(sel.shape), axis=1)
    return plan.join(out).astype(np.float32)


def run_case(case):
    meta = json.load(open(os.path.join(case, "meta.json")))
    shapes = meta["shapes"]
    plans = [Chunks(s, meta["chunk"], meta["topk"]) for s in shapes]
    two_bit = meta["values"] == "2bit"
    with open(os.path.join(case, "message_bytes.txt"), "w") as f:
        f.write(f"{message_bytes(plans, two_bit)}\n")
    if meta.get("bytes_only"):
        return
    w, steps, h = meta["ranks"], meta["steps"], meta["inner_steps"]
    decays = meta["decays"]
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
        local.append(ps)
        inner.append(torch.optim.AdamW([g for g in groups if g["params"]], lr=meta["lrs"][0],
                                       betas=(meta["beta1"], meta["beta2"]), eps=meta["eps"], foreach=False))
    ef = [np.zeros(n, dtype=np.float32) for _ in range(w)]
    decay = np.float32(meta["ef_decay"])
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
            sent = []
            for r in range(w):
                ef[r] = (decay * ef[r] + (g0 - flat(local[r]))).astype(np.float32)
                parts, off = [], 0
                for plan, k in zip(plans, sizes):
                    parts.append(compress(ef[r][off:off + k], plan, two_bit))
                    off += k
                sent.append(np.concatenate(parts))
                ef[r] = (ef[r] - sent[r]).astype(np.float32)
            total = np.zeros(n, dtype=np.float32)
            clipped = [np.zeros(n, dtype=np.float32) for _ in range(w)]
            off = 0
            for k in sizes:
                norms = torch.tensor([np.float32(math.sqrt(float((sent[r][off:off + k].astype(np.float64) ** 2)
                                                                 .sum()))) for r in range(w)], dtype=torch.float32)
                factor = torch.clamp(torch.median(norms) / (norms + 1e-8), max=1.0).numpy()
                for r in range(w):
                    clipped[r][off:off + k] = sent[r][off:off + k] * factor[r]
                off += k
            for r in range(w):
                total = (total + clipped[r]).astype(np.float32)
            mean = (total * (np.float32(1.0) / np.float32(w))).astype(np.float32)
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
    print(f"sparseloco_reference: {len(sys.argv) - 1} case(s) written")


if __name__ == "__main__":
    main()
