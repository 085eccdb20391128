#!/usr/bin/python3
"""An independent PyTorch GPT-2 (nanoGPT-style, float32) that writes the reference files the C++ model is
checked against: a randomly initialised model as an llm.c fp32 checkpoint (model.bin), and a debug state
(state.bin) holding one batch, the logits, loss and parameter gradients of that batch, then the losses and
gradient norms of 10 AdamW steps on it. It shares no code and no random numbers with the C++ side, so an
agreement means both implement the same maths.

state.bin layout (little-endian):
  int32 header[256]: [0]=20240327 (magic) [1]=2 (version) [2]=B [3]=T [4]=vocab_size [5]=padded_vocab_size
                     [6]=number of optimizer steps S [7]=AdamW's lr (float32 bits), the rest 0
  int32   x[B*T], y[B*T]          inputs and targets (-1: no target, with --mask-targets)
  float32 logits[B*T*Vp]          of the initial model (padded columns included)
  float32 loss                    mean cross-entropy over the first V columns, over the positions with a target
  float32 grads[num_params]       in llm.c's flat layout (the order of model.bin), before clipping
  float32 losses[S]               loss before each AdamW step
  float32 grad_norms[S]           global L2 gradient norm before clipping, at each step

--mask-targets sets the last target of every row and every target of row 1 to -1 ("no target", as OLMo's rows
end), which the loss skips as torch's cross_entropy(ignore_index=-1) does: the mean over the other positions.

Run with Debian's /usr/bin/python3 (it has torch). Example:
  /usr/bin/python3 dev/reference/gpt2_reference.py --config tiny --batch 4 --seq 32 --out-dir build/reference/tiny
"""
import argparse
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MODEL_MAGIC, MODEL_VERSION_FP32 = 20240326, 3
STATE_MAGIC, STATE_VERSION = 20240327, 2
NO_TARGET = -1  # a position that predicts nothing (llmc/base/targets.h's kNoTarget)
CONFIGS = {
    "tiny": dict(layers=2, heads=4, channels=64, max_seq_len=64),
    "d12": dict(layers=12, heads=12, channels=768, max_seq_len=1024),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, channels, heads, max_seq_len):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(channels, 3 * channels)
        self.c_proj = nn.Linear(channels, channels)
        # torch 1.13 has no scaled_dot_product_attention: mask explicitly before the softmax.
        causal = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool))
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        head_size = C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.heads, head_size).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_size))
        scores = scores.masked_fill(~self.causal[:T, :T], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.c_fc = nn.Linear(channels, 4 * channels)
        self.c_proj = nn.Linear(4 * channels, channels)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, channels, heads, max_seq_len):
        super().__init__()
        self.ln_1 = nn.LayerNorm(channels)
        self.attn = CausalSelfAttention(channels, heads, max_seq_len)
        self.ln_2 = nn.LayerNorm(channels)
        self.mlp = MLP(channels)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers, heads, channels, max_seq_len, vocab_size, padded_vocab_size):
        super().__init__()
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(padded_vocab_size, channels)
        self.wpe = nn.Embedding(max_seq_len, channels)
        self.h = nn.ModuleList(Block(channels, heads, max_seq_len) for _ in range(layers))
        self.ln_f = nn.LayerNorm(channels)
        self.lm_head = nn.Linear(channels, padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: the classifier is the token embedding
        self._init_gpt2(layers)

    def _init_gpt2(self, layers):
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        # the two residual projections are scaled down so the residual stream's variance does not grow with depth
        for block in self.h:
            nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * layers))
            nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * layers))
        with torch.no_grad():
            self.wte.weight[self.vocab_size:].zero_()  # llm.c files keep the padded rows at zero

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        # padded columns are computed but take no part in the softmax / loss; target -1 is no target
        loss = F.cross_entropy(logits[..., : self.vocab_size].reshape(-1, self.vocab_size), targets.reshape(-1),
                               ignore_index=NO_TARGET)
        return logits, loss


def llmc_order(model):
    """The parameter tensors in llm.c's flat layout: each kind, all layers of it contiguous."""
    per_layer = [
        lambda b: b.ln_1.weight, lambda b: b.ln_1.bias,
        lambda b: b.attn.c_attn.weight, lambda b: b.attn.c_attn.bias,
        lambda b: b.attn.c_proj.weight, lambda b: b.attn.c_proj.bias,
        lambda b: b.ln_2.weight, lambda b: b.ln_2.bias,
        lambda b: b.mlp.c_fc.weight, lambda b: b.mlp.c_fc.bias,
        lambda b: b.mlp.c_proj.weight, lambda b: b.mlp.c_proj.bias,
    ]
    tensors = [model.wte.weight, model.wpe.weight]
    for get in per_layer:
        tensors += [get(block) for block in model.h]
    return tensors + [model.ln_f.weight, model.ln_f.bias]


def mask_targets(y):
    """y with the last target of every row and every target of row 1 (when there is one) set to NO_TARGET."""
    y = y.clone()
    y[:, -1] = NO_TARGET
    if y.shape[0] > 1:
        y[1, :] = NO_TARGET
    return y


def float_bits(x):
    """A float32's bits as an int32, for the int32 headers."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def flat(tensors):
    return np.concatenate([t.detach().reshape(-1).numpy().astype(np.float32) for t in tensors])


def write_atomic(path, chunks):
    """Writes numpy arrays back to back; the rename means a file that exists is complete."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(np.ascontiguousarray(chunk).tobytes())
    os.replace(tmp, path)


def header(values):
    h = np.zeros(256, dtype=np.int32)
    h[: len(values)] = values
    return h


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--channels", type=int)
    parser.add_argument("--max-seq-len", type=int)
    parser.add_argument("--vocab-size", type=int, default=50257)
    parser.add_argument("--padded-vocab-size", type=int, default=50304)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--mask-targets", action="store_true",
                        help="no target (-1) at the last position of every row and in all of row 1")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()

    shape = dict(CONFIGS[args.config])
    for key in ("layers", "heads", "channels", "max_seq_len"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    L, H, C, maxT = shape["layers"], shape["heads"], shape["channels"], shape["max_seq_len"]
    V, Vp, B, T = args.vocab_size, args.padded_vocab_size, args.batch, args.seq
    if C % H or T > maxT or Vp < V:
        sys.exit(f"error: bad shape L={L} H={H} C={C} maxT={maxT} T={T} V={V} Vp={Vp}")

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(args.seed)
    model = GPT(L, H, C, maxT, V, Vp)
    os.makedirs(args.out_dir, exist_ok=True)
    write_atomic(os.path.join(args.out_dir, "model.bin"),
                 [header([MODEL_MAGIC, MODEL_VERSION_FP32, maxT, V, L, H, C, Vp]), flat(llmc_order(model))])

    batch_rng = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, V, (B, T + 1), generator=batch_rng)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    if args.mask_targets:
        y = mask_targets(y)

    # weight decay on the 2-D weights only (wte, wpe and the Linear weights), as llm.c / nanoGPT
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    losses, grad_norms = [], []
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        logits, loss = model(x, y)
        loss.backward()
        if step == 0:
            first_logits, first_loss = logits.detach().clone(), loss.item()
            first_grads = flat([p.grad for p in llmc_order(model)])
        grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]:.6f} grad norm {grad_norms[-1]:.6f}")

    write_atomic(os.path.join(args.out_dir, "state.bin"), [
        header([STATE_MAGIC, STATE_VERSION, B, T, V, Vp, args.steps, float_bits(args.lr)]),
        x.numpy().astype(np.int32), y.numpy().astype(np.int32),
        first_logits.numpy().astype(np.float32).reshape(-1),
        np.array([first_loss], dtype=np.float32), first_grads,
        np.array(losses, dtype=np.float32), np.array(grad_norms, dtype=np.float32),
    ])


if __name__ == "__main__":
    main()
