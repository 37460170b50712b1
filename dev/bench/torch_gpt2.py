#!/usr/bin/env python3
"""The PyTorch peer of train_gpt's GPT-2 benchmark (scripts/gpu_check.sh, stage bench).

The same model and step as train_gpt's bench runs, written the way a careful PyTorch user would
write it today: a GPT-2 (learned positions, pre-LayerNorm blocks, GELU(tanh) MLP, tied head, the
vocabulary padded to a multiple of 128), bf16 autocast over fp32 parameters, causal attention by
F.scaled_dot_product_attention (flash attention on an H100), fused AdamW (lr 3e-4, weight decay 0.1
on the matrices, betas 0.9/0.95), gradient clipping at 1.0, and torch.compile on the model. The
tokens are random (train_gpt reads synthetic shards: the data costs neither anything measurable).

Prints one line per measured step and, last, one line
    RESULT tokens_per_s=<float> mfu=<float> peak_mem_gib=<float> batch=<int> torch=<version> compiled=<0|1>
that gpu_check.sh parses. MFU counts the model FLOPs as train_gpt does (llmc/run/mfu.cpp):
6 x parameters (without the vocabulary padding) + 12 x layers x d_model x seq per token, against
the dense bf16 peak of the GPU (--peak_tflops, or looked up from the device's name). When a
micro-batch does not fit, it halves it (and says so in RESULT's batch).

Without CUDA it runs on the CPU (a smoke test of this script: tiny shapes, --no-compile).
"""
import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16_TFLOPS = [("H200", 989.4), ("H100 PCIE", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("A100", 312.0)]


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch < 2.0 (a CPU smoke test only)
            s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = s.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, n_layer, n_head, d_model, vocab, seq):
        super().__init__()
        self.vocab = vocab
        padded = (vocab + 127) // 128 * 128
        self.wte = nn.Embedding(padded, d_model)
        self.wpe = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() >= 2:  # GPT-2's init: N(0, 0.02), the residual projections scaled by 1/sqrt(2 L)
                scale = 1.0 / math.sqrt(2 * n_layer) if name.endswith(("proj.weight", "fc_proj.weight")) else 1.0
                nn.init.normal_(p, mean=0.0, std=std * scale)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        logits = logits[..., : self.vocab].float()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def model_flops_per_token(model, n_layer, d_model, seq):
    padded = model.wte.weight.size(0)
    params = sum(p.numel() for p in model.parameters()) - (padded - model.vocab) * d_model
    return 6.0 * params + 12.0 * n_layer * d_model * seq


def peak_flops(device, override):
    if override > 0:
        return override * 1e12
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device).upper()
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in name:
            return tflops * 1e12
    return 0.0


def run(args, device, batch):
    torch.manual_seed(0)
    model = GPT2(args.n_layer, args.n_head, args.d_model, args.vocab, args.seq).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **fused)
    compiled = args.compile and hasattr(torch, "compile")
    step_model = torch.compile(model) if compiled else model
    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randint(0, args.vocab, (batch, args.seq), generator=gen).to(device)
    y = torch.randint(0, args.vocab, (batch, args.seq), generator=gen).to(device)
    flops = model_flops_per_token(model, args.n_layer, args.d_model, args.seq)
    peak = peak_flops(device, args.peak_tflops)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for step in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(dt)
        print(f"step {step + 1}: loss {loss.item():.4f} {dt * 1000:.1f} ms{' (warm-up)' if step < args.warmup else ''}",
              flush=True)
    seconds = sum(times)
    tokens_per_s = batch * args.seq * len(times) / seconds
    mfu = flops * tokens_per_s / peak if peak > 0 else float("nan")
    peak_mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return tokens_per_s, mfu, peak_mem, compiled


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n_layer", type=int, default=12)
    ap.add_argument("--n_head", type=int, default=12)
    ap.add_argument("--d_model", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8, help="micro-batch (halved while it does not fit)")
    ap.add_argument("--steps", type=int, default=20, help="measured steps")
    ap.add_argument("--warmup", type=int, default=5, help="steps not measured (compilation, allocator warm-up)")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="eager mode")
    ap.add_argument("--peak_tflops", type=float, default=0.0, help="dense bf16 peak for MFU (default: by GPU name)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.d_model % args.n_head:
        sys.exit(f"torch_gpt2: d_model {args.d_model} is not a multiple of n_head {args.n_head}")
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        sys.exit("torch_gpt2: --batch and --steps must be >= 1, --warmup >= 0")
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    batch = args.batch
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    while True:
        try:
            tokens_per_s, mfu, peak_mem, compiled = run(args, device, batch)
            break
        except oom as e:
            if "out of memory" not in str(e).lower() or batch == 1:
                raise
            print(f"micro-batch {batch} does not fit; trying {batch // 2}", flush=True)
            batch //= 2
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"RESULT tokens_per_s={tokens_per_s:.1f} mfu={mfu:.4f} peak_mem_gib={peak_mem:.2f} batch={batch} "
          f"torch={torch.__version__} compiled={int(compiled)}", flush=True)


if __name__ == "__main__":
    main()
