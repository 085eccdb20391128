#!/usr/bin/env python3
"""--optimizer randomk reference (llmc/optim/demo/randomk.h), independent of the C++ code: N ranks simulated in one
process with dense float32 torch tensors, each with its own momentum; the shared weights are kept once, since every
rank applies the same averaged update.

The step (DeMo without the transform, with k seeded-random coefficients per chunk instead of the top k):
  g = grad * clip coefficient (torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6) when below 1; the rank's own
      norm); p *= 1 - lr * wd on the decayed tensors; delta = decay * delta + lr * g (ema: + (1 - decay) * g);
  per chunk the k positions below; v = delta[idx] (bf16: rounded to nearest even); delta[idx] -= alpha * v;
  mean over ranks of v: fp32 sum in rank order times 1/W; bf16: partial sums rounded to bf16 in rank order, times 1/W
  (nothing rounds at W = 1); p -= lr * sign(decode) (sign 0: lr * decode), decode = the means scattered into zeros.

Chunks (DeMo's plan): a tensor is seen as 2-D ([S] -> [1, S], [a, b, c] -> [a*b, c]); per dimension the chunk length
is the largest divisor of the size that is <= chunk (the size itself when it is <= chunk); chunk c = i * (C/n2) + j
of block row i and block column j, flat position b * n2 + d inside it; k = clamp(topk, 1, n1 * n2).

Positions, from the text of randomk.h (Python integers, everything mod 2^64):
  key = sm(sm(sm(sm(seed) ^ step) ^ tensor) ^ chunk), sm = splitmix64; draw_j = sm(key + j);
  a = list(range(n)); for j < k: r = j + draw_j % (n - j); a[j], a[r] = a[r], a[j]; idx = sorted(a[:k])
(always the whole list here; the C++ side keeps only the swapped slots when k is small against n).

Usage: randomk_reference.py CASE_DIR...  Each CASE_DIR holds meta.json, init.bin (float32 params) and grads.bin
(float32, steps x ranks x n). Writes expected.bin (float32, per step: the weights after the step, the decoded mean
update, then each rank's momentum) and expected_idx.bin (uint32, per step: every chunk's k positions in plan order).
"""
import json
import os
import sys

import numpy as np
import torch

MASK = (1 << 64) - 1


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def positions(seed, step, tensor, chunk, n, k):
    key = splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ step) ^ tensor) ^ chunk)
    a = list(range(n))
    for j in range(k):
        r = j + splitmix64((key + j) & MASK) % (n - j)
        a[j], a[r] = a[r], a[j]
    return sorted(a[:k])


def chunk_length(size, chunk):
    if size <= chunk:
        return size
    return max(d for d in range(1, chunk + 1) if size % d == 0)


class Tensor:
    def __init__(self, shape, chunk, topk):
        if len(shape) == 1:
            self.rows, self.cols = 1, shape[0]
        else:
            self.rows, self.cols = int(np.prod(shape[:-1])), shape[-1]
        self.n1, self.n2 = chunk_length(self.rows, chunk), chunk_length(self.cols, chunk)
        self.k = max(1, min(topk, self.n1 * self.n2))
        self.chunks = (self.rows // self.n1) * (self.cols // self.n2)

    def to_chunks(self, x):  # flat [rows*cols] -> [chunks, n1*n2]
        r, c = self.rows // self.n1, self.cols // self.n2
        return x.reshape(r, self.n1, c, self.n2).permute(0, 2, 1, 3).reshape(r * c, self.n1 * self.n2)

    def from_chunks(self, x):
        r, c = self.rows // self.n1, self.cols // self.n2
        return x.reshape(r, c, self.n1, self.n2).permute(0, 2, 1, 3).reshape(-1)


def to_bf16(x):
    return x.to(torch.bfloat16).float()


def mean_over_ranks(vals, wire):
    w = len(vals)
    inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(float(w), dtype=torch.float32)
    if wire == "bf16":
        if w == 1:
            return vals[0].clone()
        s = to_bf16(vals[0])
        for v in vals[1:]:
            s = to_bf16(s + to_bf16(v))
        return s * inv
    s = vals[0].clone()
    for v in vals[1:]:
        s = s + v
    return s * inv


def run_case(case):
    meta = json.load(open(os.path.join(case, "meta.json")))
    w, steps = meta["ranks"], meta["steps"]
    shapes, decays, lrs = meta["shapes"], meta["decays"], meta["lrs"]
    plans = [Tensor(s, meta["chunk"], meta["topk"]) for s in shapes]
    sizes = [int(np.prod(s)) for s in shapes]
    n = sum(sizes)
    init = np.fromfile(os.path.join(case, "init.bin"), dtype=np.float32)
    grads = np.fromfile(os.path.join(case, "grads.bin"), dtype=np.float32).reshape(steps, w, n)
    assert init.size == n

    def split(flat):
        out, off = [], 0
        for size in sizes:
            out.append(flat[off:off + size])
            off += size
        return out

    params = split(torch.from_numpy(init.copy()))
    momenta = [[torch.zeros(size, dtype=torch.float32) for size in sizes] for _ in range(w)]
    # the options as the C++ side holds them, float32, and its factors formed from them in double, rounded once
    f32 = lambda x: float(np.float32(x))
    decay, alpha, wd, clip = f32(meta["decay"]), f32(meta["alpha"]), f32(meta["weight_decay"]), f32(meta["grad_clip"])
    expected, expected_idx = [], []
    for s in range(steps):
        lr = f32(lrs[s])
        for t in range(len(params)):
            if decays[t] and wd != 0.0:
                params[t] = params[t] * np.float32(1.0 - lr * wd)
        idx = [[positions(meta["seed"], s, t, c, p.n1 * p.n2, p.k) for c in range(p.chunks)]
               for t, p in enumerate(plans)]
        sent = []  # per rank, per tensor: [chunks, k] values
        for r in range(w):
            g = torch.from_numpy(grads[s, r].copy())
            norm = float(np.sqrt(np.sum(grads[s, r].astype(np.float64) ** 2)))
            coef = clip / (norm + 1e-6)
            if clip > 0 and coef < 1:
                g = g * np.float32(coef)
            gs = split(g)
            mine = []
            for t, p in enumerate(plans):
                gscale = np.float32(1.0 - decay) if meta["momentum"] == "ema" else np.float32(lr)
                m = momenta[r][t] * np.float32(decay) + gs[t] * gscale
                ch = p.to_chunks(m).clone()
                ix = torch.tensor(idx[t], dtype=torch.int64)
                v = torch.gather(ch, 1, ix)
                if meta["values"] == "bf16":
                    v = to_bf16(v)
                ch.scatter_(1, ix, torch.gather(ch, 1, ix) - np.float32(alpha) * v)
                momenta[r][t] = p.from_chunks(ch)
                mine.append(v)
            sent.append(mine)
        decoded = []
        for t, p in enumerate(plans):
            mean = mean_over_ranks([sent[r][t] for r in range(w)], meta["values"])
            dense = torch.zeros(p.chunks, p.n1 * p.n2, dtype=torch.float32)
            dense.scatter_(1, torch.tensor(idx[t], dtype=torch.int64), mean)
            dec = p.from_chunks(dense)
            u = torch.sign(dec) if meta["sign"] else dec
            params[t] = params[t] - np.float32(lr) * u
            decoded.append(dec)
        expected.append(torch.cat(params))
        expected.append(torch.cat(decoded))
        for r in range(w):
            expected.append(torch.cat(momenta[r]))
        expected_idx.append(np.array([i for tensor in idx for chunk in tensor for i in chunk], dtype=np.uint32))
    torch.cat(expected).numpy().astype(np.float32).tofile(os.path.join(case, "expected.bin"))
    np.concatenate(expected_idx).tofile(os.path.join(case, "expected_idx.bin"))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    for case in sys.argv[1:]:
        run_case(case)


if __name__ == "__main__":
    main()
