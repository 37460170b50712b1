#!/usr/bin/python3
"""Independent PyTorch reference for train_gpt's GPT-2, and the parity files it writes.

Run with Debian's torch (python3-torch 1.13):   /usr/bin/python3 dev/reference/gpt2_reference.py
It writes (deterministically: same bytes on every run)
  test/data/ref_model.bin   weights, llm.c checkpoint format (version 3, fp32)
  test/data/ref_state.bin   the debug state described below
and test/test_parity.cpp checks the C++ CPU backend against them.

Model: GPT-2 as llm.c defines it -- learned positional embeddings, pre-LayerNorm (eps 1e-5),
causal multi-head attention scaled by 1/sqrt(head_dim), tanh-approximate GELU, 4x MLP,
final LayerNorm, LM head tied to the token embedding, vocab padded to a multiple of 128
with zero padded rows, loss = mean cross-entropy over the real vocab (logits[..., :V]).
Weights are drawn in float32 (so the stored fp32 weights are exact) and everything is
then computed in float64.

Optimizer: AdamW implemented by hand below (not torch.optim), and cross-checked against
torch.optim.AdamW + torch.nn.utils.clip_grad_norm_ in self_check():
  g  <- g * coef,  coef = min(1, grad_clip / (global_norm + 1e-6))   (torch's formula)
  m  <- b1 m + (1-b1) g;   v <- b2 v + (1-b2) g^2
  p  <- p - lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd_p * p )
with wd_p = weight_decay for the 2-D weights (wte, wpe, qkvw, attprojw, fcw, fcprojw)
and 0 for biases and LayerNorm parameters. global_norm is over all gradients (before
clipping). Every step uses the same batch (x, y); losses[k] is the loss BEFORE update k+1.

ref_state.bin layout (little-endian):
  int32 header[256]:
    [0] magic 20241121   [1] version 1
    [2] B  [3] T  [4] V (vocab_size)  [5] Vp (padded_vocab)  [6] n_layer  [7] n_head
    [8] d_model  [9] max_seq_len  [10] num_params (llm.c order, padded rows included)
    [11] n_steps (10)
    slots 16..21 hold float32 bit patterns: [16] lr [17] beta1 [18] beta2 [19] eps
    [20] weight_decay [21] grad_clip (global-norm max)
    all other slots 0
  int32 x[B*T]                 input tokens
  int32 y[B*T]                 targets
  fp32  logits[B*T*V]          real-vocab logits of the initial weights
  fp32  loss                   mean loss of the initial weights
  fp32  grads[num_params]      d loss / d params, llm.c checkpoint order (same layout as the
                               weights in ref_model.bin; padded wte rows' grads are zero)
  fp32  losses[n_steps]        loss before each AdamW update
  fp32  grad_norms[n_steps]    global gradient norm (before clipping) of each step;
                               grad_norms[0] is the norm of `grads` above
"""
import hashlib
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)  # fixed reduction order -> identical bytes on every run

# ---------------------------------------------------------------- configuration
L, NH, C = 2, 4, 32
V = 500
VP = ((V + 127) // 128) * 128  # 512
MAXT = 32
B, T = 2, 16
HS = C // NH
EPS_LN = 1e-5
SEED = 1337

N_STEPS = 10
LR, BETA1, BETA2, ADAM_EPS, WD = 1e-3, 0.9, 0.95, 1e-8, 0.1
GRAD_CLIP = 1.75  # triggers in some steps only (see the printed norms)

STATE_MAGIC, STATE_VERSION = 20241121, 1
MODEL_MAGIC, MODEL_VERSION = 20240326, 3

# llm.c checkpoint order: (name, shape, 2-D weight that gets decay)
PARAM_SPECS = [
    ("wte", (VP, C), True),
    ("wpe", (MAXT, C), True),
    ("ln1w", (L, C), False),
    ("ln1b", (L, C), False),
    ("qkvw", (L, 3 * C, C), True),
    ("qkvb", (L, 3 * C), False),
    ("attprojw", (L, C, C), True),
    ("attprojb", (L, C), False),
    ("ln2w", (L, C), False),
    ("ln2b", (L, C), False),
    ("fcw", (L, 4 * C, C), True),
    ("fcb", (L, 4 * C), False),
    ("fcprojw", (L, C, 4 * C), True),
    ("fcprojb", (L, C), False),
    ("lnfw", (C,), False),
    ("lnfb", (C,), False),
]
DECAY = {name: d for name, _, d in PARAM_SPECS}


def init_params():
    """GPT-2 init in float32 (N(0, 0.02), residual projections N(0, 0.02/sqrt(2L))), with three
    deliberate changes so that a wrong code path cannot hide in this tiny model:
      - biases and LayerNorm parameters get small random perturbations (non-trivial gradients);
      - qkvw is drawn with std 0.1, so attention scores are O(1) and the softmax is far from
        uniform (a wrong scale or mask shows clearly);
      - fcw is drawn with std 0.15, so GELU pre-activations are O(1) (tanh vs erf GELU differ).
    Returns float64 leaf tensors holding exact fp32 values."""
    g = torch.Generator().manual_seed(SEED)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    std, proj_std = 0.02, 0.02 / math.sqrt(2 * L)
    p = {}
    p["wte"] = randn(VP, C) * std
    p["wte"][V:] = 0.0  # padded rows are zero
    p["wpe"] = randn(MAXT, C) * std
    p["ln1w"] = 1.0 + 0.1 * randn(L, C)
    p["ln1b"] = 0.05 * randn(L, C)
    p["qkvw"] = randn(L, 3 * C, C) * 0.1
    p["qkvb"] = 0.02 * randn(L, 3 * C)
    p["attprojw"] = randn(L, C, C) * proj_std
    p["attprojb"] = 0.02 * randn(L, C)
    p["ln2w"] = 1.0 + 0.1 * randn(L, C)
    p["ln2b"] = 0.05 * randn(L, C)
    p["fcw"] = randn(L, 4 * C, C) * 0.15
    p["fcb"] = 0.02 * randn(L, 4 * C)
    p["fcprojw"] = randn(L, C, 4 * C) * proj_std
    p["fcprojb"] = 0.02 * randn(L, C)
    p["lnfw"] = 1.0 + 0.1 * randn(C)
    p["lnfb"] = 0.05 * randn(C)
    for name, shape, _ in PARAM_SPECS:
        assert tuple(p[name].shape) == shape and p[name].dtype == torch.float32
    return {k: v.to(torch.float64).requires_grad_(True) for k, v in p.items()}


def make_batch():
    g = torch.Generator().manual_seed(SEED + 1)
    seq = torch.randint(0, V, (B * T + 1,), generator=g, dtype=torch.int64)
    seq[3] = V - 1  # exercise the last real vocab row
    seq[7] = 0
    x = seq[:-1].view(B, T).clone()
    y = seq[1:].view(B, T).clone()
    return x, y


# ---------------------------------------------------------------- model (manual ops)
def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance
    return (x - mean) / torch.sqrt(var + EPS_LN) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(qkv):
    """qkv [B,T,3C] (q for all heads, then k, then v) -> [B,T,C]."""
    Bq, Tq, _ = qkv.shape
    q, k, v = qkv.split(C, dim=-1)
    q = q.view(Bq, Tq, NH, HS).transpose(1, 2)
    k = k.view(Bq, Tq, NH, HS).transpose(1, 2)
    v = v.view(Bq, Tq, NH, HS).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
    mask = torch.ones(Tq, Tq, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf"))
    att = att - att.amax(-1, keepdim=True)
    att = att.exp()
    att = att / att.sum(-1, keepdim=True)
    out = att @ v  # [B,NH,T,HS]
    return out.transpose(1, 2).reshape(Bq, Tq, C)


def forward(p, x, y):
    """Returns (logits[B,T,Vp], mean loss over the real vocab)."""
    Tq = x.shape[1]
    h = p["wte"][x] + p["wpe"][:Tq]
    for l in range(L):
        a = layernorm(h, p["ln1w"][l], p["ln1b"][l])
        a = attention(a @ p["qkvw"][l].T + p["qkvb"][l])
        h = h + a @ p["attprojw"][l].T + p["attprojb"][l]
        m = layernorm(h, p["ln2w"][l], p["ln2b"][l])
        m = gelu_tanh(m @ p["fcw"][l].T + p["fcb"][l])
        h = h + m @ p["fcprojw"][l].T + p["fcprojb"][l]
    h = layernorm(h, p["lnfw"], p["lnfb"])
    logits = h @ p["wte"].T
    lg = logits[..., :V].reshape(-1, V)
    lse = torch.logsumexp(lg, dim=-1)
    loss = (lse - lg.gather(1, y.reshape(-1, 1)).squeeze(1)).mean()
    return logits, loss


def forward_alt(p, x, y):
    """The same model written with torch's library layers (F.layer_norm, F.gelu(tanh),
    nn.functional.multi_head_attention_forward, F.cross_entropy): an independent check of
    the hand-written ops above."""
    Tq = x.shape[1]
    h = F.embedding(x, p["wte"]) + F.embedding(torch.arange(Tq), p["wpe"])
    causal = torch.triu(torch.ones(Tq, Tq, dtype=torch.bool), diagonal=1)  # True = masked
    for l in range(L):
        a = F.layer_norm(h, (C,), p["ln1w"][l], p["ln1b"][l], EPS_LN)
        at = a.transpose(0, 1)  # [T,B,C]
        o, _ = F.multi_head_attention_forward(
            at, at, at, C, NH, p["qkvw"][l], p["qkvb"][l], None, None, False, 0.0,
            p["attprojw"][l], p["attprojb"][l], training=False, need_weights=False, attn_mask=causal)
        h = h + o.transpose(0, 1)
        m = F.layer_norm(h, (C,), p["ln2w"][l], p["ln2b"][l], EPS_LN)
        m = F.linear(F.gelu(F.linear(m, p["fcw"][l], p["fcb"][l]), approximate="tanh"), p["fcprojw"][l],
                     p["fcprojb"][l])
        h = h + m
    h = F.layer_norm(h, (C,), p["lnfw"], p["lnfb"], EPS_LN)
    logits = F.linear(h, p["wte"])
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), y.reshape(-1))
    return logits, loss


def loss_and_grads(p, x, y):
    for t in p.values():
        t.grad = None
    logits, loss = forward(p, x, y)
    loss.backward()
    return logits.detach(), loss.detach(), {k: t.grad.detach().clone() for k, t in p.items()}


# ---------------------------------------------------------------- AdamW (by hand)
def train_steps(p0, x, y, n_steps):
    p = {k: t.detach().clone().requires_grad_(True) for k, t in p0.items()}
    m = {k: torch.zeros_like(t) for k, t in p.items()}
    v = {k: torch.zeros_like(t) for k, t in p.items()}
    losses, norms = [], []
    for step in range(1, n_steps + 1):
        _, loss, grads = loss_and_grads(p, x, y)
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        coef = min(1.0, GRAD_CLIP / (norm + 1e-6))
        losses.append(float(loss))
        norms.append(norm)
        bc1, bc2 = 1.0 - BETA1 ** step, 1.0 - BETA2 ** step
        with torch.no_grad():
            for k in p:
                g = grads[k] * coef
                m[k].mul_(BETA1).add_((1.0 - BETA1) * g)
                v[k].mul_(BETA2).add_((1.0 - BETA2) * g * g)
                wd = WD if DECAY[k] else 0.0
                upd = (m[k] / bc1) / (torch.sqrt(v[k] / bc2) + ADAM_EPS) + wd * p[k]
                p[k].sub_(LR * upd)
    return losses, norms


def train_steps_torch(p0, x, y, n_steps):
    """Cross-check of train_steps with torch.optim.AdamW and clip_grad_norm_."""
    p = {k: t.detach().clone().requires_grad_(True) for k, t in p0.items()}
    groups = [{"params": [p[k] for k in p if DECAY[k]], "weight_decay": WD},
              {"params": [p[k] for k in p if not DECAY[k]], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(BETA1, BETA2), eps=ADAM_EPS)
    losses = []
    for _ in range(n_steps):
        opt.zero_grad(set_to_none=True)
        _, loss = forward(p, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), GRAD_CLIP)
        losses.append(float(loss))
        opt.step()
    return losses


# ---------------------------------------------------------------- self checks
def self_check(p, x, y, logits, loss, grads, losses):
    # 1. the hand-written ops against torch's library layers
    with torch.no_grad():
        lg2, loss2 = forward_alt(p, x, y)
    err = float((lg2 - logits).abs().max())
    assert err < 1e-12, f"forward_alt logits differ by {err}"
    assert abs(float(loss2) - float(loss)) < 1e-12, "forward_alt loss differs"
    assert float(logits[..., V:].abs().max()) == 0.0, "padded logits must be zero"

    # 2. autograd against central finite differences (float64) on a few entries
    probes = [("wte", (int(x[0, 1]), 3)), ("wte", (int(y[1, 2]), 5)), ("wpe", (4, 7)), ("ln1w", (0, 2)),
              ("ln1b", (1, 9)), ("qkvw", (0, 5, 11)), ("qkvb", (1, 2 * C + 3)), ("qkvb", (0, 4)),
              ("attprojw", (1, 6, 8)), ("attprojb", (0, 1)), ("ln2b", (1, 0)), ("fcw", (1, 70, 13)),
              ("fcb", (0, 100)), ("fcprojw", (0, 20, 90)), ("fcprojb", (1, 31)), ("lnfw", (17,)), ("lnfb", (5,))]
    h = 1e-6
    with torch.no_grad():
        for name, idx in probes:
            t = p[name]
            orig = float(t[idx])
            t[idx] = orig + h
            lp = float(forward(p, x, y)[1])
            t[idx] = orig - h
            lm = float(forward(p, x, y)[1])
            t[idx] = orig
            fd = (lp - lm) / (2 * h)
            ag = float(grads[name][idx])
            assert abs(fd - ag) <= 1e-7 + 1e-5 * abs(ag), f"finite difference {name}{idx}: fd {fd} autograd {ag}"

    # 3. the hand-written AdamW against torch.optim.AdamW
    losses2 = train_steps_torch(p, x, y, len(losses))
    d = max(abs(a - b) for a, b in zip(losses, losses2))
    assert d < 1e-12, f"manual AdamW differs from torch.optim.AdamW by {d}"
    print(f"self-check ok: alt-forward |dlogits| {err:.2e}, {len(probes)} finite differences, "
          f"AdamW vs torch.optim {d:.2e}")


# ---------------------------------------------------------------- files
def f32_bytes(t):
    return np.ascontiguousarray(t.detach().to(torch.float32).numpy()).astype("<f4").tobytes()


def llmc_flat(d):
    return b"".join(f32_bytes(d[name]) for name, _, _ in PARAM_SPECS)


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    out_dir = os.path.join(root, "test", "data")
    if len(sys.argv) > 1:
        out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)

    p = init_params()
    x, y = make_batch()
    logits, loss, grads = loss_and_grads(p, x, y)
    losses, norms = train_steps(p, x, y, N_STEPS)
    assert losses[0] == float(loss)
    assert any(n > GRAD_CLIP for n in norms) and any(n < GRAD_CLIP for n in norms), \
        f"pick GRAD_CLIP so clipping triggers in some steps only: norms {norms}"
    self_check(p, x, y, logits, loss, grads, losses)
    assert float(grads["wte"][V:].abs().max()) == 0.0

    num_params = sum(int(np.prod(s)) for _, s, _ in PARAM_SPECS)

    hdr = [0] * 256
    hdr[0:8] = [MODEL_MAGIC, MODEL_VERSION, MAXT, V, L, NH, C, VP]
    model_bytes = struct.pack("<256i", *hdr) + llmc_flat(p)
    assert len(model_bytes) == 1024 + 4 * num_params

    sh = [0] * 256
    sh[0:12] = [STATE_MAGIC, STATE_VERSION, B, T, V, VP, L, NH, C, MAXT, num_params, N_STEPS]
    hyper = struct.unpack("<6i", struct.pack("<6f", LR, BETA1, BETA2, ADAM_EPS, WD, GRAD_CLIP))
    sh[16:22] = hyper
    state = [struct.pack("<256i", *sh),
             x.to(torch.int32).numpy().astype("<i4").tobytes(),
             y.to(torch.int32).numpy().astype("<i4").tobytes(),
             f32_bytes(logits[..., :V]),
             struct.pack("<f", float(loss)),
             llmc_flat(grads),
             struct.pack(f"<{N_STEPS}f", *losses),
             struct.pack(f"<{N_STEPS}f", *norms)]
    state_bytes = b"".join(state)
    assert len(state_bytes) == 1024 + 8 * B * T + 4 * (B * T * V + 1 + num_params + 2 * N_STEPS)

    for fname, data in (("ref_model.bin", model_bytes), ("ref_state.bin", state_bytes)):
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(data)
        print(f"wrote {os.path.join(out_dir, fname)}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    print(f"shape L={L} NH={NH} C={C} V={V} Vp={VP} maxT={MAXT} B={B} T={T}, {num_params} params")
    print(f"AdamW lr={LR} betas=({BETA1},{BETA2}) eps={ADAM_EPS} wd={WD} (2-D weights) grad_clip={GRAD_CLIP}")
    print("losses:", " ".join(f"{l:.6f}" for l in losses))
    print("norms: ", " ".join(f"{n:.4f}" for n in norms))


if __name__ == "__main__":
    main()
