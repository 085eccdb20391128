#!/usr/bin/python3
"""Oracle checks of ./sample_gpt and ./eval_gpt against PyTorch: the model file is loaded into the independent
reference GPT-2 (dev/reference/gpt2_reference.py), which gives each step's logits for the tokens sample_gpt
printed, and the loss of the windows eval_gpt reads.

  greedy MODEL PROMPT      --temperature 0, 100 tokens past max_seq_len: every token is the reference's most
                           likely one for the same (sliding) context, to float tolerance
  distribution MODEL PROMPT  5 settings of temperature / top-k / top-p, 2,000 one-token samples each: every token
                           lies in the reference's kept set, and the counts pass a chi-square test against the
                           reference's renormalized probabilities (p > 1e-4)

  loss MODEL GLOB B T N     eval_gpt's loss over N batches (0: all) of B x T tokens equals the reference's mean
                           cross-entropy over the same windows (B*T+1 tokens every B*T, shard after shard)
  loss_olmo MODEL GLOB B T N  the same on OLMo uint16 token files: B instances of T tokens a batch, file after
                           file, the last position of each without a target (-1); the reference's mean is
                           cross_entropy(ignore_index=-1) over all the batches' B*(T-1) targets each
  choices MODEL JSONL BIN TOKENS  eval_gpt --choices on HellaSwag-style JSON Lines and on the same examples in
                           llm.c's eval file (BIN, written from js-tiktoken's tokens in TOKENS) agree line for line;
                           each completion's summed and mean loss equals the reference's, on each row run alone with
                           the context cropped from the left to fit, and so do the predictions (but near ties), the
                           crop counts, acc and acc_norm

The tools' --json lines give their results. Exit status 1 on the first failure, with what differed.
"""
import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "dev", "reference"))
from gpt2_reference import GPT, llmc_order  # noqa: E402

EOT = 50256


def fail(message):
    print("FAIL  " + message)
    sys.exit(1)


def load_model(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        params = np.frombuffer(f.read(), dtype=np.float32)
    if header[0] != 20240326 or header[1] != 3:
        fail(f"{path}: not an llm.c fp32 model file")
    max_seq_len, vocab, layers, heads, channels, padded = (int(v) for v in header[2:8])
    model = GPT(layers, heads, channels, max_seq_len, vocab, padded)
    offset = 0
    with torch.no_grad():
        for tensor in llmc_order(model):
            n = tensor.numel()
            tensor.copy_(torch.from_numpy(params[offset:offset + n].copy()).view_as(tensor))
            offset += n
    if offset != params.size:
        fail(f"{path}: {params.size} parameters in the file, {offset} in the reference model")
    model.eval()
    return model, max_seq_len, vocab


def next_logits(model, context, max_seq_len, vocab):
    window = torch.tensor([context[-max_seq_len:]], dtype=torch.long)
    with torch.no_grad():
        logits, _ = model(window, torch.zeros_like(window))
    return logits[0, -1, :vocab].double()


def sample(model_path, prompt, *flags):
    command = ["./sample_gpt", "--model", model_path, "--prompt", prompt, "--json", *flags]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"{' '.join(command)}: exit {result.returncode}: {result.stderr.strip()}")
    return [json.loads(line) for line in result.stdout.splitlines()]


def greedy(model_path, prompt):
    model, max_seq_len, vocab = load_model(model_path)
    tokens_wanted = max_seq_len + 36
    [line] = sample(model_path, prompt, "--temperature", "0", "--tokens", str(tokens_wanted))
    context = [EOT] + line["prompt_tokens"]
    if len(line["tokens"]) != tokens_wanted:
        fail(f"greedy: {len(line['tokens'])} tokens, wanted {tokens_wanted}")
    for i, token in enumerate(line["tokens"]):
        logits = next_logits(model, context, max_seq_len, vocab)
        best = logits.max().item()
        # fp32 sums in another order: a near-tie may go either way, anything else may not
        if logits[token].item() < best - 1e-4 * max(1.0, abs(best)):
            fail(f"greedy: token {i} is {token} (reference logit {logits[token].item():.6f}), the reference's most "
                 f"likely is {int(logits.argmax())} ({best:.6f}); context of {len(context)} tokens")
        context.append(token)
    print(f"ok    greedy: {tokens_wanted} tokens (context up to {len(context)}, window {max_seq_len}) are the "
          f"reference's most likely")


def kept_probabilities(logits, temperature, top_k, top_p):
    """The reference's sampling distribution: softmax(logits / T), top-k, then top-p, renormalized."""
    p = torch.softmax(logits / temperature, dim=0)
    if top_k > 0:
        threshold = torch.topk(p, top_k).values[-1]
        p = torch.where(p >= threshold, p, torch.zeros_like(p))
    if top_p < 1.0:
        sorted_p, order = torch.sort(p, descending=True)
        before = torch.cumsum(sorted_p, 0) - sorted_p  # probability of the more likely tokens
        keep = before < top_p * sorted_p.sum()
        mask = torch.zeros_like(p, dtype=torch.bool)
        mask[order[keep]] = True
        p = torch.where(mask, p, torch.zeros_like(p))
    return p / p.sum()


def chi_square_z(counts, expected):
    """Wilson-Hilferty z of the chi-square statistic over bins with >= 5 expected (the rest pooled)."""
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:  # too little left over for a bin of its own: fold it into the largest
        largest = int(np.argmax(exp[:-1]))
        obs[largest] += obs[-1]
        exp[largest] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    k = len(exp) - 1
    if k < 1:
        return 0.0, 0
    statistic = float(((obs - exp) ** 2 / exp).sum())
    z = ((statistic / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return z, k


def distribution(model_path, prompt):
    model, max_seq_len, vocab = load_model(model_path)
    draws = 2000
    # a top-p that the third most likely token crosses halfway: it must be kept, and it is drawn often enough
    # for the counts to show it if it were not
    context = [EOT] + sample(model_path, prompt, "--tokens", "0")[0]["prompt_tokens"]
    likeliest = torch.sort(torch.softmax(next_logits(model, context, max_seq_len, vocab), dim=0), descending=True)[0]
    third_halfway = float(likeliest[:2].sum() + 0.5 * likeliest[2])
    settings = [(0.8, 0, 1.0), (1.0, 10, 1.0), (1.2, 0, 0.6), (1.0, 50, 0.9), (1.0, 0, round(third_halfway, 6))]
    for temperature, top_k, top_p in settings:
        lines = sample(model_path, prompt, "--tokens", "1", "--num_samples", str(draws), "--seed", "7",
                       "--temperature", str(temperature), "--top_k", str(top_k), "--top_p", str(top_p))
        context = [EOT] + lines[0]["prompt_tokens"]
        expected_p = kept_probabilities(next_logits(model, context, max_seq_len, vocab), temperature, top_k, top_p)
        counts = np.zeros(vocab)
        for line in lines:
            counts[line["tokens"][0]] += 1
        setting = f"temperature {temperature}, top_k {top_k}, top_p {top_p}"
        kept = int((expected_p > 0).sum())
        outside = [t for t in np.nonzero(counts)[0] if expected_p[t] == 0]
        if outside:
            # a token at the very edge of the kept set may fall on either side with float rounding
            full = torch.softmax(next_logits(model, context, max_seq_len, vocab) / temperature, dim=0)
            edge = full[expected_p > 0].min().item()
            if any(full[t].item() < edge * (1 - 1e-4) for t in outside):
                fail(f"distribution ({setting}): tokens {outside[:5]} were drawn but the reference keeps only "
                     f"{kept} tokens")
        z, dof = chi_square_z(counts, expected_p.numpy() * draws)
        if z > 3.72:  # p < 1e-4
            fail(f"distribution ({setting}): chi-square z = {z:.2f} over {dof} degrees of freedom; the counts do "
                 f"not follow the reference's probabilities")
        print(f"ok    distribution ({setting}): {draws} draws over {kept} kept tokens, chi-square z = {z:.2f} "
              f"({dof} degrees of freedom)")


def loss(model_path, pattern, batch, seq, batches):
    batch, seq, batches = int(batch), int(seq), int(batches)
    model, max_seq_len, vocab = load_model(model_path)
    command = ["./eval_gpt", "--model", model_path, "--data", pattern, "--batch_size", str(batch), "--seq_len",
               str(seq), "--batches", str(batches), "--json"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"{' '.join(command)}: exit {result.returncode}: {result.stderr.strip()}")
    ours = json.loads(result.stdout)
    stride = batch * seq
    losses = []
    for path in sorted(glob.glob(pattern)):
        tokens = np.fromfile(path, dtype=np.uint16, offset=1024).astype(np.int64)
        for w in range((len(tokens) - 1) // stride if len(tokens) > stride else 0):
            if batches and len(losses) == batches:
                break
            window = torch.from_numpy(tokens[w * stride:w * stride + stride + 1])
            with torch.no_grad():
                _, value = model(window[:-1].view(batch, seq), window[1:].view(batch, seq))
            losses.append(float(value))
    expected = sum(losses) / len(losses)
    if ours["batches"] != len(losses) or ours["tokens"] != len(losses) * stride:
        fail(f"loss: eval_gpt read {ours['batches']} batches ({ours['tokens']} tokens), the reference {len(losses)}")
    if abs(ours["loss"] - expected) > 1e-5 * abs(expected):
        fail(f"loss: eval_gpt {ours['loss']:.7f}, the reference {expected:.7f} over {len(losses)} batches")
    print(f"ok    loss over {len(losses)} batches of B={batch} T={seq}: {ours['loss']:.6f}, the reference's "
          f"{expected:.6f}")


def loss_olmo(model_path, pattern, batch, seq, batches):
    batch, seq, batches = int(batch), int(seq), int(batches)
    model, _, _ = load_model(model_path)
    command = ["./eval_gpt", "--model", model_path, "--data", pattern, "--data_format", "olmo", "--memmap_dtype",
               "uint16", "--batch_size", str(batch), "--seq_len", str(seq), "--batches", str(batches), "--json"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"{' '.join(command)}: exit {result.returncode}: {result.stderr.strip()}")
    ours = json.loads(result.stdout)
    inputs, targets = [], []
    for path in sorted(glob.glob(pattern)):
        tokens = np.asarray(np.memmap(path, dtype="<u2", mode="r")).astype(np.int64)
        instances = len(tokens) // seq
        for b in range(instances // batch):
            if batches and len(inputs) == batches:
                break
            x = torch.from_numpy(tokens[b * batch * seq:(b + 1) * batch * seq].reshape(batch, seq).copy())
            inputs.append(x)
            targets.append(torch.cat([x[:, 1:], torch.full((batch, 1), -1)], dim=1))
    with torch.no_grad():  # one cross-entropy over every batch's positions: the mean over all their targets
        logits = torch.cat([model(x, y)[0][..., :model.vocab_size] for x, y in zip(inputs, targets)])
        expected = F.cross_entropy(logits.reshape(-1, model.vocab_size), torch.cat(targets).reshape(-1),
                                   ignore_index=-1).item()
    if ours["batches"] != len(inputs) or ours["targets"] != len(inputs) * batch * (seq - 1):
        fail(f"loss_olmo: eval_gpt read {ours['batches']} batches ({ours['targets']} targets), the reference "
             f"{len(inputs)} of B={batch} T={seq}")
    if abs(ours["loss"] - expected) > 1e-5 * abs(expected):
        fail(f"loss_olmo: eval_gpt {ours['loss']:.7f}, the reference {expected:.7f} over {len(inputs)} batches")
    print(f"ok    loss on OLMo files over {len(inputs)} batches of B={batch} T={seq} ({ours['targets']} targets): "
          f"{ours['loss']:.6f}, the reference's {expected:.6f}")


def eval_choices(model_path, choices_path):
    command = ["./eval_gpt", "--model", model_path, "--choices", choices_path, "--per_example", "--json"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"{' '.join(command)}: exit {result.returncode}: {result.stderr.strip()}")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return lines[:-1], lines[-1]


def choices(model_path, jsonl_path, bin_path, tokens_path):
    model, max_seq_len, vocab = load_model(model_path)
    examples = json.load(open(tokens_path))  # [{"label", "context": [...], "endings": [[...], ...]}, ...]
    from_jsonl, summary = eval_choices(model_path, jsonl_path)
    from_bin, summary_bin = eval_choices(model_path, bin_path)
    if from_jsonl != from_bin:
        differ = next(i for i, (a, b) in enumerate(zip(from_jsonl, from_bin)) if a != b) \
            if len(from_jsonl) == len(from_bin) else "count"
        fail(f"choices: the JSON Lines file (our tokenizer) and the eval file (js-tiktoken's tokens) differ at "
             f"example {differ}")
    if len(from_jsonl) != len(examples):
        fail(f"choices: {len(from_jsonl)} examples scored, {len(examples)} written")
    correct = correct_norm = cropped = ties = 0
    worst = 0.0
    for i, (ours, example) in enumerate(zip(from_jsonl, examples)):
        longest = max(len(e) for e in example["endings"])
        crop = max(0, len(example["context"]) + longest - (max_seq_len + 1))
        context = example["context"][crop:]
        sums, means = [], []
        for ending in example["endings"]:
            row = torch.tensor([context + ending], dtype=torch.long)
            with torch.no_grad():
                logits, _ = model(row[:, :-1], torch.zeros_like(row[:, :-1]))
            logp = torch.log_softmax(logits[0, :, :vocab].double(), dim=-1)
            targets = row[0, 1:]
            token_losses = -logp[torch.arange(len(targets)), targets][len(context) - 1:]
            sums.append(float(token_losses.sum()))
            means.append(sums[-1] / len(ending))
        for name, expected in (("sum_losses", sums), ("mean_losses", means)):
            for a, b in zip(ours[name], expected):
                worst = max(worst, abs(a - b) / max(1.0, abs(b)))
                if abs(a - b) > 1e-4 * max(1.0, abs(b)):
                    fail(f"choices: example {i}: {name} {ours[name]}, the reference's {expected}")
        for name, values in (("prediction", sums), ("prediction_norm", means)):
            best = min(range(len(values)), key=lambda c: values[c])
            near_tie = sorted(values)[1] - values[best] < 1e-4
            ties += near_tie
            if ours[name] != best and not near_tie:
                fail(f"choices: example {i}: {name} {ours[name]}, the reference's {best} ({values})")
        if ours["label"] != example["label"] or ours["cropped"] != crop:
            fail(f"choices: example {i}: label {ours['label']} / cropped {ours['cropped']}, written "
                 f"{example['label']} / {crop}")
        correct += ours["prediction"] == example["label"]
        correct_norm += ours["prediction_norm"] == example["label"]
        cropped += crop > 0
    n = len(examples)
    if (summary["examples"], summary["acc"], summary["acc_norm"], summary["cropped"]) != \
            (n, correct / n, correct_norm / n, cropped) or summary_bin["acc_norm"] != summary["acc_norm"]:
        fail(f"choices: summary {summary}, expected {n} examples, acc {correct / n}, acc_norm {correct_norm / n}, "
             f"{cropped} cropped")
    print(f"ok    choices: {n} examples ({cropped} cropped) from JSON Lines and from an llm.c eval file agree, and "
          f"with the reference (largest relative loss difference {worst:.1e}, {ties} near ties): acc "
          f"{summary['acc']:.3f}, acc_norm {summary['acc_norm']:.3f}")


if __name__ == "__main__":
    {"greedy": greedy, "distribution": distribution, "loss": loss, "loss_olmo": loss_olmo,
     "choices": choices}[sys.argv[1]](*sys.argv[2:])
