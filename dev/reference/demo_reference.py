#!/usr/bin/python3
"""Independent DeMo reference for testing the C++ optimizer (llmc/optim/demo/demo_optimizer.cpp).

Follows the step of the DeMo paper's reference implementation literally, with dense float32 torch tensors:
explicit DCT-II basis matrices (built in float64, stored float32), top-k by a stable sort of -|E| (ties: lower
index first, the C++ rule), an all-gather modelled as the list of every rank's (idx, val), the scatter-mean as
a dense sum and a dense count (mean over the ranks that selected a coefficient, 0 where none did), and sign.
N ranks are simulated in one process; every rank applies the same gathered update, so the parameters are
kept once. Written from the algorithm's description, sharing no code with the C++ side. DemoReference holds the
state and the step's two halves; run_case drives it with a case's gradients, dev/reference/olmo_reference.py
with a torch model's.

Delayed update ("delay": 1, --demo_delay 1): the round gathered at step s is applied at step s+1, with step s's
lr. Step s first applies the pending round of step s-1 (scatter-mean, decode, sign, params -= lr[s-1] * sign),
then runs every rank's weight decay (on the parameters as they are after that), momentum, encode, top-k and
feedback with lr[s], and keeps the gathered lists as the pending round. The first step applies nothing; the
last step's round is never applied.

Eager delayed update ("eager": 1 with "delay": 1, --demo_eager): the shared parameters above are unchanged, and
each rank's working parameters (what its next forward sees) are the shared ones after the step minus
lr[s] * sign(decode(that rank's own top-k of step s)), the rank's own share applied alone, without weight decay.

Unsigned update ("sign": 0, --demo_sign false): params -= lr * decode(G) instead of lr * sign(decode(G)), and
the eager working parameters likewise. Random transform ("transform": "random", --demo_transform random): every
chunk length's DCT basis replaced by random_orthogonal_basis(n), for encode and decode.

Usage: demo_reference.py CASE [CASE ...]   (reads CASE.json and CASE.bin, writes CASE.out)
  CASE.json: {"ranks", "steps", "shapes", "lr": [per step], "weight_decay", "decay_groups": "all"|"matrices",
              "grad_clip" (<= 0: off), "decay", "topk", "chunk", "momentum": "lr_scaled"|"ema",
              "alpha", "values": "fp32"|"bf16"|"sign", "delay": 0|1, "eager": 0|1 (both optional, default 0),
              "sign": 0|1 (optional, default 1: --demo_sign), "transform": "dct"|"random" (optional, default
              "dct": --demo_transform)}
  CASE.bin:  float32 initial parameters (all tensors flat, in order), then for each step, for each rank,
             that rank's gradient (same layout).
  CASE.out:  for each step: parameters after the step, the pre-sign update decode(G) applied in the step
             (with delay 1: the previous step's round; zeros at the first step, which applies nothing), then
             each rank's momentum, then (eager only) each rank's working parameters and each rank's own
             pre-sign decode(own top-k); all float32 in the parameter layout.
"""
import json
import math
import sys

import numpy as np
import torch


def chunk_length(size, chunk):
    if size <= chunk:
        return size
    for n in range(chunk, 1, -1):
        if size % n == 0:
            return n
    return 1


def dct_basis(n):
    """C[k][i] = sqrt((k == 0 ? 1 : 2) / n) cos(pi (2i+1) k / (2n)); where (2i+1) k is a multiple of n the angle
    is a multiple of pi/2 and the cosine is exactly 1, 0, -1 or 0 (np.cos(pi/2) would be 6e-17)."""
    k = np.arange(n, dtype=np.int64)[:, None]
    i = np.arange(n, dtype=np.int64)[None, :]
    m = ((2 * i + 1) * k) % (4 * n)  # the angle in units of pi / (2n), reduced by the period 4n
    scale = np.where(k == 0, math.sqrt(1.0 / n), math.sqrt(2.0 / n))
    cosine = np.cos(math.pi * m.astype(np.float64) / (2 * n))
    quarter = np.array([1.0, 0.0, -1.0, 0.0])[m // n % 4]
    cosine = np.where(m % n == 0, quarter, cosine)
    return torch.from_numpy((scale * cosine).astype(np.float32))


def random_orthogonal_basis(n):
    """--demo_transform random: the fixed random orthogonal n x n matrix Q (rows orthonormal) that
    llmc/optim/demo/dct.h specifies, built from that specification alone: splitmix64 seeded from a constant and
    n, Box-Muller normals filling A row by row, modified Gram-Schmidt over A's rows in float64 (Python floats,
    sums in index order). n = 1 gives [1]."""
    if n == 1:
        return torch.ones(1, 1, dtype=torch.float32)
    mask = (1 << 64) - 1
    state = 0x44654D6F52616E64 ^ ((n * 0x9E3779B97F4A7C15) & mask)

    def splitmix64():
        nonlocal state
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    normals = []
    while len(normals) < n * n:
        a, b = splitmix64(), splitmix64()
        u1, u2 = ((a >> 11) + 1) / 2.0 ** 53, (b >> 11) / 2.0 ** 53
        r = math.sqrt(-2.0 * math.log(u1))
        normals += [r * math.cos(2.0 * math.pi * u2), r * math.sin(2.0 * math.pi * u2)]
    rows = [normals[i * n:(i + 1) * n] for i in range(n)]
    q = []
    for v in rows:
        v = list(v)
        for qj in q:
            dot = 0.0
            for x, y in zip(qj, v):
                dot += x * y
            v = [y - dot * x for x, y in zip(qj, v)]
        norm = 0.0
        for y in v:
            norm += y * y
        norm = math.sqrt(norm)
        q.append([y / norm for y in v])
    return torch.tensor(q, dtype=torch.float64).to(torch.float32)


def basis(n, transform):
    if transform == "dct":
        return dct_basis(n)
    if transform == "random":
        return random_orthogonal_basis(n)
    if transform == "identity":  # --optimizer topk: the momentum itself
        return torch.eye(n, dtype=torch.float32)
    raise ValueError(transform)


def top_k(mags, k):
    """Per row, the indices of the k largest magnitudes, ordered as a stable sort of -mags orders them (larger
    first; ties: lower index first): the first k of torch.sort(-mags, stable=True). Sorting only the k chosen is
    what makes a reference run on a model's 3M-entry embedding affordable."""
    kth = torch.topk(mags, k, dim=1).values[:, -1:]  # the k-th largest value of each row (ties have one value)
    above, tied = mags > kth, mags == kth
    room = k - above.sum(dim=1, keepdim=True)  # how many of the tied the row still takes, lowest indices first
    chosen = above | (tied & (torch.cumsum(tied, dim=1) <= room))
    idx = chosen.nonzero()[:, 1].reshape(mags.shape[0], k)  # ascending index within each row
    order = torch.sort(-torch.gather(mags, 1, idx), dim=1, stable=True).indices
    return torch.gather(idx, 1, order)


class Chunking:
    """A tensor seen as [rows, cols] (1-D: [1, S]; more dims: leading ones flattened) cut into n1 x n2 blocks."""

    def __init__(self, shape, chunk, topk, transform="dct"):
        if len(shape) == 1:
            self.rows, self.cols, self.n1 = 1, shape[0], 1
        else:
            self.rows, self.cols = int(np.prod(shape[:-1])), shape[-1]
            self.n1 = chunk_length(self.rows, chunk)
        self.n2 = chunk_length(self.cols, chunk)
        self.k = max(1, min(topk, self.n1 * self.n2))
        self.c1, self.c2 = basis(self.n1, transform), basis(self.n2, transform)

    def to_chunks(self, x):  # [rows*cols] -> [chunks, n1*n2], chunk order row-major over blocks
        br, bc = self.rows // self.n1, self.cols // self.n2
        return x.reshape(br, self.n1, bc, self.n2).permute(0, 2, 1, 3).reshape(br * bc, self.n1 * self.n2)

    def from_chunks(self, c):
        br, bc = self.rows // self.n1, self.cols // self.n2
        return c.reshape(br, bc, self.n1, self.n2).permute(0, 2, 1, 3).reshape(-1)

    def encode(self, x):  # E = C1 X C2^T per block
        blocks = self.to_chunks(x).reshape(-1, self.n1, self.n2)
        return (self.c1 @ blocks @ self.c2.T).reshape(-1, self.n1 * self.n2)

    def decode(self, e):  # X = C1^T E C2 per block
        blocks = e.reshape(-1, self.n1, self.n2)
        return self.from_chunks((self.c1.T @ blocks @ self.c2).reshape(-1, self.n1 * self.n2))


def quantize(vals, encoding):
    if encoding == "fp32":
        return vals
    if encoding == "bf16":
        return vals.to(torch.bfloat16).to(torch.float32)  # round to nearest even
    if encoding == "sign":
        scale = vals.abs().mean(dim=1, keepdim=True)
        signed = torch.where(vals < 0, -scale, scale)
        return torch.where(scale == 0, torch.zeros_like(signed), signed)
    raise ValueError(encoding)


class DemoReference:
    """DeMo's state for `ranks` simulated ranks on tensors of `shapes`, with a CASE.json's options (`cfg`): every
    rank's momentum, and the step's two halves. dev/reference/olmo_reference.py drives it with a torch model."""

    def __init__(self, cfg, shapes, ranks):
        self.cfg, self.shapes = cfg, [tuple(s) for s in shapes]
        self.chunkings = [Chunking(s, cfg["chunk"], cfg["topk"], cfg.get("transform", "dct")) for s in self.shapes]
        self.use_sign = cfg.get("sign", 1)
        assert self.use_sign in (0, 1), "sign must be 0 or 1"
        self.momentum = [[torch.zeros(int(np.prod(s)), dtype=torch.float32) for s in self.shapes]
                         for _ in range(ranks)]

    def compress(self, r, params, grads, lr):
        """Rank r's half, on flat per-tensor tensors: clips `grads` in place (the LOCAL gradient, as
        torch.nn.utils.clip_grad_norm_ does), weight decay on `params` (rank 0 only: every rank decays its
        identical copy, kept once here), momentum, encode, top-k, quantize, feedback. Returns the per-tensor
        (idx, val) this rank sends, the dense coefficients it sent, and the gradient norm before clipping."""
        cfg = self.cfg
        norm = torch.norm(torch.stack([torch.norm(g, 2.0) for g in grads]), 2.0)
        if cfg["grad_clip"] > 0:
            coef = torch.clamp(cfg["grad_clip"] / (norm + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef)
        wd, decay, alpha = cfg["weight_decay"], cfg["decay"], cfg["alpha"]
        sends, sents = [], []
        for t, (ch, g) in enumerate(zip(self.chunkings, grads)):
            if r == 0 and wd != 0 and (cfg["decay_groups"] == "all" or len(self.shapes[t]) == 2):
                params[t].mul_(1 - lr * wd)
            delta = self.momentum[r][t]
            delta.mul_(decay).add_(g, alpha=(lr if cfg["momentum"] == "lr_scaled" else 1 - decay))
            e = ch.encode(delta)
            idx = top_k(e.abs(), ch.k)
            val = quantize(torch.gather(e, 1, idx), cfg["values"])
            sent = torch.zeros_like(e).scatter_(1, idx, val)
            if alpha == 1.0:
                delta.sub_(ch.decode(sent))
            else:
                delta.sub_(alpha * ch.decode(sent))
            sends.append((idx, val))
            sents.append(sent)
        return sends, sents, norm.item()

    def apply_round(self, params, gathered, lr):
        """Every rank's half: gathered[t] is every rank's (idx, val) of tensor t, in rank order; params -= lr *
        sign(decode(mean over the ranks that sent each coefficient)) ("sign": 0: lr * decode(...) itself). Returns
        the pre-sign decode per tensor."""
        presign = []
        for t, ch in enumerate(self.chunkings):
            nchunks = (ch.rows // ch.n1) * (ch.cols // ch.n2)
            total_val = torch.zeros(nchunks, ch.n1 * ch.n2, dtype=torch.float32)
            count = torch.zeros(nchunks, ch.n1 * ch.n2, dtype=torch.float32)
            for idx, val in gathered[t]:  # rank order
                total_val.scatter_add_(1, idx, val)
                count.scatter_add_(1, idx, torch.ones_like(val))
            mean = torch.where(count > 0, total_val / count.clamp(min=1), torch.zeros_like(total_val))
            u = ch.decode(mean)
            presign.append(u)
            params[t].add_(self.update(u), alpha=-lr)
        return presign

    def update(self, u):
        """What the parameters step along: sign(u), or u itself with "sign": 0."""
        return torch.sign(u) if self.use_sign else u

    def step(self, params, grads_per_rank, lr):
        """One undelayed step of every rank (grads_per_rank[r]: rank r's per-tensor gradients, clipped in place).
        Returns the pre-sign update and each rank's gradient norm before clipping."""
        gathered, norms = [[] for _ in self.shapes], []
        for r, grads in enumerate(grads_per_rank):
            sends, _, norm = self.compress(r, params, grads, lr)
            for t, send in enumerate(sends):
                gathered[t].append(send)
            norms.append(norm)
        return self.apply_round(params, gathered, lr), norms


def run_case(case_json, case_bin, out_bin):
    with open(case_json) as f:
        cfg = json.load(f)
    shapes = [tuple(s) for s in cfg["shapes"]]
    numels = [int(np.prod(s)) for s in shapes]
    total = sum(numels)
    ranks, steps = cfg["ranks"], cfg["steps"]
    data = np.fromfile(case_bin, dtype=np.float32)
    assert data.size == total * (1 + steps * ranks), "case file size does not match its description"

    def split(flat):
        out, pos = [], 0
        for n in numels:
            out.append(flat[pos:pos + n].clone())
            pos += n
        return out

    params = split(torch.from_numpy(data[:total].copy()))
    demo = DemoReference(cfg, shapes, ranks)
    delay = cfg.get("delay", 0)
    assert delay in (0, 1), "delay must be 0 or 1"
    eager = cfg.get("eager", 0)
    assert eager in (0, 1) and (delay or not eager), "eager must be 0 or 1, and needs delay 1"

    outputs = []
    pending = None  # delay 1: (gathered, lr) of the previous step, not yet applied
    for step in range(steps):
        lr = cfg["lr"][step]
        applied = demo.apply_round(params, *pending) if pending is not None else None  # before this step's decay
        gathered = [[] for _ in shapes]  # per tensor: every rank's (idx, val)
        own = []  # eager: each rank's dense sent coefficients
        for r in range(ranks):
            start = total * (1 + step * ranks + r)
            grads = split(torch.from_numpy(data[start:start + total].copy()))
            sends, sents, _ = demo.compress(r, params, grads, lr)
            for t, send in enumerate(sends):
                gathered[t].append(send)
            own.append(sents)  # this rank's own share alone: mean over one rank = its values
        if delay:
            presign = applied if applied is not None else [torch.zeros(n, dtype=torch.float32) for n in numels]
            pending = (gathered, lr)
        else:
            presign = demo.apply_round(params, gathered, lr)
        outputs.append(torch.cat(params))
        outputs.append(torch.cat(presign))
        for r in range(ranks):
            outputs.append(torch.cat(demo.momentum[r]))
        if eager:
            own_presign = [[ch.decode(own[r][t]) for t, ch in enumerate(demo.chunkings)] for r in range(ranks)]
            for r in range(ranks):
                outputs.append(torch.cat([p - lr * demo.update(u) for p, u in zip(params, own_presign[r])]))
            for r in range(ranks):
                outputs.append(torch.cat(own_presign[r]))
    torch.cat(outputs).numpy().astype(np.float32).tofile(out_bin)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for case in sys.argv[1:]:  # one process for every case: torch imports once
        run_case(case + ".json", case + ".bin", case + ".out")


if __name__ == "__main__":
    main()
