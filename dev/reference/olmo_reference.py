#!/usr/bin/python3
"""An independent PyTorch OLMo (the DeMo paper's architecture, float32) that writes the reference files the C++
OLMo model is checked against (test/unit/check_model_vs_torch.cpp): a randomly initialised model as a version-6
model file (model.bin), the debug state of dev/reference/gpt2_reference.py (state.bin: one batch, its logits, loss
and every gradient, then the losses and gradient norms of 10 AdamW steps on it), and with --demo-ranks, for each
N, demo_rN.bin: 10 DeMo steps on N simulated ranks, driven by dev/reference/demo_reference.py's step. Written from
the architecture's description, sharing no code and no random numbers with the C++ side.

The architecture: a sequential pre-norm decoder, x = x + attn_out(attn(norm(x))); x = x + ff_out(swiglu(ff_proj(
norm(x)))); no biases; norm is LayerNorm without parameters (eps 1e-5) or, with --norm rmsnorm, RMSNorm with a
weight (x / sqrt(mean(x^2) + 1e-5) * w); att_proj gives q, k, v; RoPE on q and k in GPT-NeoX's rotate-half layout
(cos/sin computed in float64, rounded to float32); causal softmax attention scaled by 1/sqrt(head size); ff_proj's
8C outputs are (x, gate) halves and swiglu = silu(gate) * x; a final norm; logits = h @ wte^T over the padded
vocabulary, cross-entropy over the first vocab_size columns, averaged over the positions with a target (target -1
is none, as torch's ignore_index; --mask-targets gives state.bin's batch some: gpt2_reference.py's).

demo_rN.bin layout (little-endian):
  int32 header[256]: [0]=20240329 (magic) [1]=1 (version) [2]=B [3]=T [4]=vocab_size [5]=padded_vocab_size
                     [6]=steps S [7]=ranks N [8]=topk [9]=chunk, and as float32 bits [10]=lr [11]=momentum decay
                     [12]=weight decay (2-D tensors) [13]=grad clip; the rest 0
  int32   x[N][B*T], y[N][B*T]    each rank's batch, the same at every step
  float32 losses[S][N]            each rank's loss before each step
  float32 grad_norms[S][N]        each rank's local gradient norm before clipping
  float32 params[num_params]      after the last step, in model.bin's order

Run with Debian's /usr/bin/python3 (it has torch). Example:
  /usr/bin/python3 dev/reference/olmo_reference.py --norm rmsnorm --demo-ranks 1 2 --out-dir build/reference/olmo_tiny_rms
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_reference import DemoReference  # noqa: E402  (the project's DeMo oracle, beside this file)
# the shared state format's writers and its "no target"
from gpt2_reference import NO_TARGET, float_bits, header, mask_targets, write_atomic  # noqa: E402

MODEL_MAGIC, MODEL_VERSION_ARCH_FP32 = 20240326, 6
STATE_MAGIC, STATE_VERSION = 20240327, 2
DEMO_MAGIC, DEMO_VERSION = 20240329, 1
NORM_EPS = 1e-5


class Norm(nn.Module):
    """LayerNorm without parameters, or RMSNorm with a weight."""

    def __init__(self, channels, kind):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(channels)) if kind == "rmsnorm" else None

    def forward(self, x):
        if self.kind == "layernorm":
            return F.layer_norm(x, x.shape[-1:], eps=NORM_EPS)
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + NORM_EPS) * self.weight


def rope_tables(seq_len, head_size, theta):
    """cos and sin of angle t * theta^(-2i/hs) for position t and pair i, repeated over both halves of a head."""
    inv_freq = theta ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)  # (T, hs): pair (i, i + hs/2) shares an angle
    return angles.cos().float(), angles.sin().float()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Block(nn.Module):
    def __init__(self, channels, heads, norm):
        super().__init__()
        self.heads = heads
        self.attn_norm = Norm(channels, norm)
        self.att_proj = nn.Linear(channels, 3 * channels, bias=False)
        self.attn_out = nn.Linear(channels, channels, bias=False)
        self.ff_norm = Norm(channels, norm)
        self.ff_proj = nn.Linear(channels, 8 * channels, bias=False)
        self.ff_out = nn.Linear(4 * channels, channels, bias=False)

    def attention(self, x, cos, sin):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.att_proj(x).split(C, dim=-1)
        q, k, v = (z.view(B, T, self.heads, hs).transpose(1, 2) for z in (q, k, v))  # (B, H, T, hs)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        y = F.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
        return self.attn_out(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attn_norm(x), cos, sin)
        h, gate = self.ff_proj(self.ff_norm(x)).chunk(2, dim=-1)
        return x + self.ff_out(F.silu(gate) * h)


class OLMo(nn.Module):
    def __init__(self, layers, heads, channels, vocab_size, padded_vocab_size, norm, rope_theta):
        super().__init__()
        self.vocab_size, self.heads, self.rope_theta = vocab_size, heads, rope_theta
        self.wte = nn.Parameter(torch.empty(padded_vocab_size, channels))
        self.blocks = nn.ModuleList(Block(channels, heads, norm) for _ in range(layers))
        self.ln_f = Norm(channels, norm)
        self._init_mitchell(channels)

    def _init_mitchell(self, C):
        # OLMo's "mitchell" init: normal truncated at +-3 std; 1/sqrt(d) for the inputs' projections, and the
        # residual outputs scaled down with their fan-in and depth.
        def trunc(w, std):  # by rejection: redraw what falls outside; 10x faster than trunc_normal_'s erfinv
            with torch.no_grad():
                w.normal_(0.0, std)
                while True:
                    out = w.abs() > 3 * std
                    n = int(out.sum())
                    if n == 0:
                        break
                    w[out] = torch.randn(n) * std

        trunc(self.wte, 1 / math.sqrt(C))
        for l, b in enumerate(self.blocks):
            trunc(b.att_proj.weight, 1 / math.sqrt(C))
            trunc(b.ff_proj.weight, 1 / math.sqrt(C))
            trunc(b.attn_out.weight, 1 / math.sqrt(2 * C * (l + 1)))
            trunc(b.ff_out.weight, 1 / math.sqrt(2 * 4 * C * (l + 1)))
        with torch.no_grad():
            self.wte[self.vocab_size:].zero_()  # the padded rows stay 0, as model files keep them
            # OLMo starts RMSNorm weights at 1; here they scatter around 1, so that a norm which ignores or
            # misplaces its weight cannot agree with this one.
            for norm in [m for b in self.blocks for m in (b.attn_norm, b.ff_norm)] + [self.ln_f]:
                if norm.weight is not None:
                    norm.weight.add_(0.2 * torch.randn_like(norm.weight))

    def forward(self, idx, targets):
        B, T = idx.shape
        C = self.wte.shape[1]
        cos, sin = rope_tables(T, C // self.heads, self.rope_theta)
        x = F.embedding(idx, self.wte)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.ln_f(x) @ self.wte.t()  # tied: the classifier is the token embedding
        loss = F.cross_entropy(logits[..., : self.vocab_size].reshape(-1, self.vocab_size), targets.reshape(-1),
                               ignore_index=NO_TARGET)
        return logits, loss


def layout_order(model):
    """The parameter tensors in the C++ layout's order: wte, then each kind with all its layers contiguous
    (attn_norm, att_proj, attn_out, ff_norm, ff_proj, ff_out), then ln_f; norms only when they have a weight."""
    kinds = [lambda b: b.attn_norm.weight, lambda b: b.att_proj.weight, lambda b: b.attn_out.weight,
             lambda b: b.ff_norm.weight, lambda b: b.ff_proj.weight, lambda b: b.ff_out.weight]
    tensors = [model.wte]
    for get in kinds:
        tensors += [get(b) for b in model.blocks if get(b) is not None]
    if model.ln_f.weight is not None:
        tensors.append(model.ln_f.weight)
    return tensors


def flat(tensors):
    return np.concatenate([t.detach().reshape(-1).numpy().astype(np.float32) for t in tensors])


def random_batch(generator, B, T, V):
    tokens = torch.randint(0, V, (B, T + 1), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def run_adamw(model, x, y, steps, lr):
    """The project's AdamW (gpt2_reference.py's): betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the 2-D
    tensors only, the global gradient norm clipped to 1. Returns the first step's logits, loss and gradients,
    and every step's loss and pre-clipping norm."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}] + ([{"params": no_decay, "weight_decay": 0.0}] if no_decay else [])
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    losses, grad_norms = [], []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        logits, loss = model(x, y)
        loss.backward()
        if step == 0:
            first = (logits.detach().clone(), loss.item(), flat([p.grad for p in layout_order(model)]))
        grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
        optimizer.step()
        losses.append(loss.item())
        print(f"adamw step {step}: loss {losses[-1]:.6f} grad norm {grad_norms[-1]:.6f}")
    return first, losses, grad_norms


def run_demo(model, batches, steps, cfg):
    """`steps` undelayed DeMo steps of len(batches) simulated ranks, rank r always on batches[r]: every rank's
    gradient at the shared parameters, then demo_reference's step (local clip, weight decay, momentum, top-k,
    all-gather, sign of the mean) on the model's parameters in place."""
    tensors = layout_order(model)
    demo = DemoReference(cfg, [tuple(t.shape) for t in tensors], len(batches))
    params = [t.data.view(-1) for t in tensors]  # views: the step updates the model
    losses, grad_norms = [], []
    for step in range(steps):
        grads, step_losses = [], []
        for x, y in batches:
            model.zero_grad(set_to_none=True)
            _, loss = model(x, y)
            loss.backward()
            grads.append([t.grad.detach().clone().view(-1) for t in tensors])
            step_losses.append(loss.item())
        _, norms = demo.step(params, grads, cfg["lr"])
        losses.append(step_losses)
        grad_norms.append(norms)
        print(f"demo W={len(batches)} step {step}: losses {step_losses} grad norms {norms}")
    return losses, grad_norms


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=50280)
    parser.add_argument("--padded-vocab-size", type=int, default=50304)
    parser.add_argument("--norm", choices=["layernorm", "rmsnorm"], default="layernorm")
    parser.add_argument("--rope-theta", type=float, default=10000.0)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW's")
    parser.add_argument("--mask-targets", action="store_true",
                        help="state.bin's batch: no target (-1) at the last position of every row and in all of row 1")
    parser.add_argument("--demo-ranks", type=int, nargs="*", default=[], help="write demo_rN.bin for each N")
    parser.add_argument("--demo-lr", type=float, default=1e-4)
    parser.add_argument("--demo-topk", type=int, default=32)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()

    L, H, C, maxT = args.layers, args.heads, args.channels, args.max_seq_len
    V, Vp, B, T = args.vocab_size, args.padded_vocab_size, args.batch, args.seq
    if C % H or (C // H) % 2 or T > maxT or Vp < V:
        sys.exit(f"error: bad shape L={L} H={H} C={C} maxT={maxT} T={T} V={V} Vp={Vp}")
    theta = float(np.float32(args.rope_theta))  # the model file holds it as a float

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(args.seed)
    model = OLMo(L, H, C, V, Vp, args.norm, theta)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    os.makedirs(args.out_dir, exist_ok=True)
    arch = [2, 3 if args.norm == "rmsnorm" else 2, 2, 2, float_bits(theta), 1, 0, 8 * C]
    write_atomic(os.path.join(args.out_dir, "model.bin"),
                 [header([MODEL_MAGIC, MODEL_VERSION_ARCH_FP32, maxT, V, L, H, C, Vp] + arch),
                  flat(layout_order(model))])

    batch_rng = torch.Generator().manual_seed(args.seed + 1)
    x, y = random_batch(batch_rng, B, T, V)
    if args.mask_targets:
        y = mask_targets(y)
    (logits, loss, grads), losses, grad_norms = run_adamw(model, x, y, args.steps, args.lr)
    write_atomic(os.path.join(args.out_dir, "state.bin"), [
        header([STATE_MAGIC, STATE_VERSION, B, T, V, Vp, args.steps, float_bits(args.lr)]),
        x.numpy().astype(np.int32), y.numpy().astype(np.int32),
        logits.numpy().astype(np.float32).reshape(-1), np.array([loss], dtype=np.float32), grads,
        np.array(losses, dtype=np.float32), np.array(grad_norms, dtype=np.float32),
    ])

    # DeMo as the project's defaults (top-k 32 of 64x64 chunks, lr-scaled momentum with decay 0.999, fp32 values,
    # full feedback), with weight decay on the 2-D tensors and the local clip at 1 so both are exercised.
    cfg = dict(topk=args.demo_topk, chunk=64, decay=0.999, momentum="lr_scaled", alpha=1.0, values="fp32",
               weight_decay=0.1, decay_groups="matrices", grad_clip=1.0, lr=args.demo_lr)
    for ranks in args.demo_ranks:
        model.load_state_dict(initial)
        batches = [random_batch(batch_rng, B, T, V) for _ in range(ranks)]
        demo_losses, demo_norms = run_demo(model, batches, args.steps, cfg)
        write_atomic(os.path.join(args.out_dir, f"demo_r{ranks}.bin"), [
            header([DEMO_MAGIC, DEMO_VERSION, B, T, V, Vp, args.steps, ranks, cfg["topk"], cfg["chunk"],
                    float_bits(cfg["lr"]), float_bits(cfg["decay"]), float_bits(cfg["weight_decay"]),
                    float_bits(cfg["grad_clip"])]),
            np.stack([b[0].numpy() for b in batches]).astype(np.int32).reshape(-1),
            np.stack([b[1].numpy() for b in batches]).astype(np.int32).reshape(-1),
            np.array(demo_losses, dtype=np.float32).reshape(-1), np.array(demo_norms, dtype=np.float32).reshape(-1),
            flat(layout_order(model)),
        ])


if __name__ == "__main__":
    main()
