#!/usr/bin/python3
"""Independent float64 PyTorch reference for train_gpt's mixture-of-experts layers (model.moe),
in a GPT-2 and a Llama model, and the parity files it writes.

Run with Debian's torch (python3-torch; transformers is not used):
    /usr/bin/python3 dev/reference/moe_reference.py [out_dir]
It writes, deterministically, for each case in CASES:
  test/data/<case>_model.safetensors   the initial weights (F32) under the names train_gpt's
                                        Hugging Face format uses (below)
  test/data/<case>_state.safetensors   the batch and what the model does with it
and test/test_moe_parity.cpp checks the C++ CPU backend against them.

The MoE layer (in place of the MLP in the layers l with l % every == every - 1), written here
from its definition, dense over the experts (no permutation):
  probs = softmax(x @ router^T)                        [N, E], x = the MLP's input (normed)
  (topv, topi) = topk(probs, k) (descending)           gates = topv / topv.sum(-1)
  keep[n, j]: the (token, slot) pairs claim places of their expert in token order (n, then j);
              a pair whose expert already has `capacity` places is dropped;
              capacity = ceil(capacity_factor * N * k / E), capacity_factor 0 = no limit
  out[n] = sum_j keep[n, j] * gates[n, j] * expert_{topi[n, j]}(x[n])
  expert: GPT-2: c_proj(gelu_tanh(c_fc(x))) with biases; Llama: w2(silu(w1 x) * w3 x)
  aux = E * sum_e f_e * P_e,  f_e = #{(n, j): topi[n, j] = e} / (N k) (before drops, no gradient),
        P_e = mean_n probs[n, e]     (Switch Transformer's loss; Mixtral's load_balancing_loss_func / k)
  loss = mean cross-entropy + aux_loss_coef * sum over the MoE layers of aux
The rest of the model:
  GPT-2 (llm.c's): h = wte[x] + wpe[t]; per layer h += attn_proj(attn(qkv(LN1(h)))), h += MLP(LN2(h));
        logits = LN_f(h) @ wte^T; LayerNorm eps 1e-5, fused qkv with bias, causal softmax attention.
  Llama: as dev/reference/llama_reference.py (RMSNorm, rotary positions, SwiGLU), untied head.
Weights are drawn in float32 (exact in the F32 files), everything is computed in float64. Inits
chosen so nothing hides: router std 0.5 (well separated routing: the k-th and (k+1)-th
probabilities of every token differ by more than MIN_GAP in every step, asserted, so a float32
implementation routes identically), expert input weights std 0.15, norm weights 1 + 0.1 N(0,1),
biases 0.02 N(0,1), the rest std 0.02.

Optimizer: AdamW by hand as in llama_reference.py (clipping by the global norm, weight decay on
every 2-D weight, bias correction), 10 steps on the same batch; losses[k] and grad_norms[k] are
those before update k+1.

Names in the files (train_gpt's Hugging Face format, llmc/model/families.cpp): GPT-2: transformers'
GPT2LMHeadModel names, Conv1D weights (c_attn, c_proj, c_fc) stored transposed [in, out]; its MoE
tensors h.<l>.moe.router [E, C], h.<l>.moe.e<x>.fcw [Fe, C], .fcb [Fe], .fcprojw [C, Fe], .fcprojb [C].
Llama: LlamaForCausalLM names; MoE layers as MixtralForCausalLM's
model.layers.<l>.block_sparse_moe.gate.weight [E, C] and .experts.<x>.w1/w3 [Fe, C], w2 [C, Fe].
<case>_model.safetensors __metadata__: arch, n_layer, n_head, d_model, vocab_size, max_seq_len,
(llama: n_kv_head, ffn_dim, rope_theta, norm_eps), num_experts, top_k, expert_ffn_dim, every,
aux_loss_coef, capacity_factor, num_params.
<case>_state.safetensors: tokens, targets [B, T]; logits [B, T, V]; loss [1] (with the aux term);
aux [1] (sum over MoE layers, without the coefficient); dropped [1] (pairs dropped in the first
forward); grad.<name> (file layout) for every weight; losses, grad_norms [n_steps]; final.<name>.
"""
import hashlib
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)

CASES = [
    # every layer MoE, dropless
    dict(name="moe_gpt2", arch="gpt2", seed=1601, n_layer=2, n_head=2, d_model=16, vocab_size=61, max_seq_len=16,
         num_experts=4, top_k=2, expert_ffn_dim=24, every=1, aux_loss_coef=0.05, capacity_factor=0.0,
         B=2, T=8, grad_clip=1.5),
    # layer 1 MoE (every 2), layer 0 dense; capacity factor 1.0: drops
    dict(name="moe_llama_cap", arch="llama", seed=1602, n_layer=2, n_head=4, n_kv_head=2, d_model=16, ffn_dim=32,
         vocab_size=61, max_seq_len=16, rope_theta=10000.0, norm_eps=1e-5, num_experts=4, top_k=2,
         expert_ffn_dim=20, every=2, aux_loss_coef=0.05, capacity_factor=1.0, B=2, T=8, grad_clip=1.8),
]
N_STEPS = 10
LR, BETA1, BETA2, ADAM_EPS, WD = 1e-3, 0.9, 0.95, 1e-6, 0.1
MIN_GAP = 2e-5


class Case:
    def __init__(self, d):
        self.__dict__.update(d)
        self.HS = self.d_model // self.n_head

    def is_moe(self, l):
        return l % self.every == self.every - 1

    def tensor_specs(self):
        """(name, shape as computed here [out, in], transposed in the file) in file order."""
        C, V, E, Fe = self.d_model, self.vocab_size, self.num_experts, self.expert_ffn_dim
        L = range(self.n_layer)
        dense = [l for l in L if not self.is_moe(l)]
        moe = [l for l in L if self.is_moe(l)]
        s = []
        if self.arch == "gpt2":
            s.append(("transformer.wte.weight", (V, C), False))
            s.append(("transformer.wpe.weight", (self.max_seq_len, C), False))
            per = [("ln_1.weight", (C,), False, L), ("ln_1.bias", (C,), False, L),
                   ("attn.c_attn.weight", (3 * C, C), True, L), ("attn.c_attn.bias", (3 * C,), False, L),
                   ("attn.c_proj.weight", (C, C), True, L), ("attn.c_proj.bias", (C,), False, L),
                   ("ln_2.weight", (C,), False, L), ("ln_2.bias", (C,), False, L),
                   ("mlp.c_fc.weight", (4 * C, C), True, dense), ("mlp.c_fc.bias", (4 * C,), False, dense),
                   ("mlp.c_proj.weight", (C, 4 * C), True, dense), ("mlp.c_proj.bias", (C,), False, dense)]
            for n, shape, tr, layers in per:  # kind-major: every layer's tensor before the next kind
                s += [(f"transformer.h.{l}.{n}", shape, tr) for l in layers]
            s += [(f"h.{l}.moe.router", (E, C), False) for l in moe]
            for n, shape in (("fcw", (Fe, C)), ("fcb", (Fe,)), ("fcprojw", (C, Fe)), ("fcprojb", (C,))):
                s += [(f"h.{l}.moe.e{e}.{n}", shape, False) for l in moe for e in range(E)]
            s.append(("transformer.ln_f.weight", (C,), False))
            s.append(("transformer.ln_f.bias", (C,), False))
        else:
            Q, KV, F_ = self.n_head * self.HS, self.n_kv_head * self.HS, self.ffn_dim
            s.append(("model.embed_tokens.weight", (V, C), False))
            per = [("input_layernorm.weight", (C,), L), ("self_attn.q_proj.weight", (Q, C), L),
                   ("self_attn.k_proj.weight", (KV, C), L), ("self_attn.v_proj.weight", (KV, C), L),
                   ("self_attn.o_proj.weight", (C, Q), L), ("post_attention_layernorm.weight", (C,), L),
                   ("mlp.gate_proj.weight", (F_, C), dense), ("mlp.up_proj.weight", (F_, C), dense),
                   ("mlp.down_proj.weight", (C, F_), dense)]
            for n, shape, layers in per:
                s += [(f"model.layers.{l}.{n}", shape, False) for l in layers]
            x = "model.layers.{}.block_sparse_moe."
            s += [(x.format(l) + "gate.weight", (E, C), False) for l in moe]
            for n, shape in (("w1", (Fe, C)), ("w3", (Fe, C)), ("w2", (C, Fe))):
                s += [(x.format(l) + f"experts.{e}.{n}.weight", shape, False) for l in moe for e in range(E)]
            s.append(("model.norm.weight", (C,), False))
            s.append(("lm_head.weight", (V, C), False))
        return s


def init_params(c):
    g = torch.Generator().manual_seed(c.seed)
    p = {}
    for name, shape, _ in c.tensor_specs():
        r = torch.randn(*shape, generator=g, dtype=torch.float32)
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "layernorm.weight", "norm.weight")):
            p[name] = 1.0 + 0.1 * r
        elif len(shape) == 1:
            p[name] = 0.02 * r
        elif name.endswith(("moe.router", "gate.weight")):
            p[name] = 0.5 * r
        elif name.endswith(("fcw", "w1.weight", "w3.weight", "c_fc.weight", "gate_proj.weight", "up_proj.weight",
                            "q_proj.weight", "k_proj.weight", "c_attn.weight")):
            p[name] = 0.15 * r
        else:
            p[name] = 0.02 * r
    return {k: v.to(torch.float64).requires_grad_(True) for k, v in p.items()}


def make_batch(c):
    g = torch.Generator().manual_seed(c.seed + 1)
    seq = torch.randint(0, c.vocab_size, (c.B * c.T + 1,), generator=g, dtype=torch.int64)
    seq[3] = c.vocab_size - 1
    return seq[:-1].view(c.B, c.T).clone(), seq[1:].view(c.B, c.T).clone()


# ---------------------------------------------------------------- the MoE layer
def capacity(c, N):
    if c.capacity_factor == 0:
        return N * c.top_k
    return min(N * c.top_k, math.ceil(c.capacity_factor * N * c.top_k / c.num_experts))


def moe_layer(c, x, router, expert, info):
    """x [N, C]; expert(e, x) -> [N, C]; info collects the routing (gap, aux, drops)."""
    N, E, K = x.shape[0], c.num_experts, c.top_k
    probs = torch.softmax(x @ router.T, dim=-1)
    srt = probs.detach().sort(dim=-1, descending=True).values
    info["gap"] = min(info.get("gap", 1.0), float((srt[:, K - 1] - srt[:, K]).min()))
    topv, topi = torch.topk(probs, K, dim=-1)
    gates = topv / topv.sum(-1, keepdim=True)
    cap, used = capacity(c, N), [0] * E
    keep = torch.zeros(N, K, dtype=x.dtype)
    for n in range(N):
        for j in range(K):
            e = int(topi[n, j])
            if used[e] < cap:
                used[e] += 1
                keep[n, j] = 1.0
    info["dropped"] = info.get("dropped", 0) + int((keep == 0).sum())
    out = torch.zeros_like(x)
    for e in range(E):
        y = expert(e, x)  # every token through every expert; the mask picks
        w = ((topi == e).to(x.dtype) * keep * gates).sum(-1)
        out = out + w[:, None] * y
    f = torch.stack([(topi == e).to(x.dtype).sum() for e in range(E)]) / (N * K)
    aux = E * (f * probs.mean(0)).sum()
    info["aux"] = info.get("aux", 0.0) + aux
    info.setdefault("routes", []).append(topi.clone())
    return out


# ---------------------------------------------------------------- the models
def layernorm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def attention(q, k, v, Tq):
    """q [B, NH, T, HS], k/v [B, NH, T, HS] -> [B, T, NH*HS]."""
    mask = torch.ones(Tq, Tq, dtype=torch.bool).tril()
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    o = att @ v
    return o.transpose(1, 2).reshape(q.shape[0], Tq, -1)


def forward(c, p, x, y, info):
    Bq, Tq = x.shape
    NH, HS, C = c.n_head, c.HS, c.d_model
    info.clear()
    if c.arch == "gpt2":
        h = p["transformer.wte.weight"][x] + p["transformer.wpe.weight"][:Tq]
        for l in range(c.n_layer):
            w = lambda n: p[f"transformer.h.{l}.{n}"]
            a = layernorm(h, w("ln_1.weight"), w("ln_1.bias"))
            qkv = a @ w("attn.c_attn.weight").T + w("attn.c_attn.bias")
            q, k, v = (t.view(Bq, Tq, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=-1))
            h = h + attention(q, k, v, Tq) @ w("attn.c_proj.weight").T + w("attn.c_proj.bias")
            m = layernorm(h, w("ln_2.weight"), w("ln_2.bias"))
            if c.is_moe(l):
                e_ = lambda e, n: p[f"h.{l}.moe.e{e}.{n}"]
                expert = lambda e, t: gelu_tanh(t @ e_(e, "fcw").T + e_(e, "fcb")) @ e_(e, "fcprojw").T + e_(e, "fcprojb")
                h = h + moe_layer(c, m.reshape(-1, C), p[f"h.{l}.moe.router"], expert, info).view(Bq, Tq, C)
            else:
                h = h + gelu_tanh(m @ w("mlp.c_fc.weight").T + w("mlp.c_fc.bias")) @ w("mlp.c_proj.weight").T \
                    + w("mlp.c_proj.bias")
        h = layernorm(h, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
        logits = h @ p["transformer.wte.weight"].T
    else:
        NKV = c.n_kv_head
        inv_freq = 1.0 / c.rope_theta ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS)
        ang = torch.outer(torch.arange(Tq, dtype=torch.float64), inv_freq)
        emb = torch.cat([ang, ang], dim=-1)
        dt = p["model.embed_tokens.weight"].dtype
        cos, sin = emb.cos().to(dt), emb.sin().to(dt)
        h = p["model.embed_tokens.weight"][x]
        for l in range(c.n_layer):
            w = lambda n: p[f"model.layers.{l}.{n}.weight"]
            a = rmsnorm(h, w("input_layernorm"), c.norm_eps)
            q = (a @ w("self_attn.q_proj").T).view(Bq, Tq, NH, HS).transpose(1, 2)
            k = (a @ w("self_attn.k_proj").T).view(Bq, Tq, NKV, HS).transpose(1, 2)
            v = (a @ w("self_attn.v_proj").T).view(Bq, Tq, NKV, HS).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
            h = h + attention(q, k, v, Tq) @ w("self_attn.o_proj").T
            m = rmsnorm(h, w("post_attention_layernorm"), c.norm_eps)
            if c.is_moe(l):
                pre = f"model.layers.{l}.block_sparse_moe."
                e_ = lambda e, n: p[pre + f"experts.{e}.{n}.weight"]
                expert = lambda e, t: (F.silu(t @ e_(e, "w1").T) * (t @ e_(e, "w3").T)) @ e_(e, "w2").T
                h = h + moe_layer(c, m.reshape(-1, C), p[pre + "gate.weight"], expert, info).view(Bq, Tq, C)
            else:
                g = m @ w("mlp.gate_proj").T
                h = h + (F.silu(g) * (m @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T
        h = rmsnorm(h, p["model.norm.weight"], c.norm_eps)
        logits = h @ p["lm_head.weight"].T
    lg = logits.reshape(-1, c.vocab_size)
    ce = (torch.logsumexp(lg, dim=-1) - lg.gather(1, y.reshape(-1, 1)).squeeze(1)).mean()
    return logits, ce + c.aux_loss_coef * info["aux"]


def loss_and_grads(c, p, x, y, info):
    for t in p.values():
        t.grad = None
    logits, loss = forward(c, p, x, y, info)
    loss.backward()
    return logits.detach(), loss.detach(), {k: t.grad.detach().clone() for k, t in p.items()}


def train_steps(c, p0, x, y, n_steps, dtype=torch.float64):
    decay = {n: len(s) == 2 for n, s, _ in c.tensor_specs()}
    p = {k: t.detach().to(dtype).clone().requires_grad_(True) for k, t in p0.items()}
    m = {k: torch.zeros_like(t) for k, t in p.items()}
    v = {k: torch.zeros_like(t) for k, t in p.items()}
    losses, norms, gap, routes = [], [], 1.0, []
    for step in range(1, n_steps + 1):
        info = {}
        _, loss, grads = loss_and_grads(c, p, x, y, info)
        gap = min(gap, info["gap"])
        routes += info["routes"]
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
        coef = min(1.0, c.grad_clip / (norm + 1e-6))
        losses.append(float(loss))
        norms.append(norm)
        bc1, bc2 = 1.0 - BETA1 ** step, 1.0 - BETA2 ** step
        with torch.no_grad():
            for k in p:
                g = grads[k] * coef
                m[k].mul_(BETA1).add_((1.0 - BETA1) * g)
                v[k].mul_(BETA2).add_((1.0 - BETA2) * g * g)
                wd = WD if decay[k] else 0.0
                p[k].sub_(LR * ((m[k] / bc1) / (torch.sqrt(v[k] / bc2) + ADAM_EPS) + wd * p[k]))
    return losses, norms, {k: t.detach() for k, t in p.items()}, gap, routes


def rel_errors(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm()), float((a - b).abs().max() / b.abs().max())


def comparable(c, name, a, b):
    """(a, b) without the elements whose trained value is rounding noise: GPT-2's key bias (rows
    [C, 2C) of c_attn.bias) has a zero gradient in exact arithmetic (the softmax is invariant to
    q . b_k, the same for every key), so AdamW turns the rounding noise of its gradient into
    steps of about lr. Used for the weights after training only."""
    if name.endswith("attn.c_attn.bias"):
        C = c.d_model
        return torch.cat([a[:C], a[2 * C:]]), torch.cat([b[:C], b[2 * C:]])
    return a, b


def self_check(c, p, x, y, logits, loss, grads, losses, norms, final, routes):
    # 1. autograd against central finite differences on a few entries of the MoE tensors
    #    (f_e is piecewise constant: the probes keep the routing, asserted)
    names = [n for n, s, _ in c.tensor_specs() if "moe" in n]
    h = 1e-6
    with torch.no_grad():
        for name in names[:: max(1, len(names) // 12)]:
            t = p[name]
            idx = tuple((3 * i + 1) % s for i, s in enumerate(t.shape))
            orig = float(t[idx])
            info = {}
            t[idx] = orig + h
            lp = float(forward(c, p, x, y, info)[1])
            t[idx] = orig - h
            lm = float(forward(c, p, x, y, info)[1])
            t[idx] = orig
            fd, ag = (lp - lm) / (2 * h), float(grads[name][idx])
            assert abs(fd - ag) <= 1e-8 + 1e-5 * abs(ag), f"{c.name}: finite difference {name}{idx}: {fd} vs {ag}"
    # 2. float32: the same routing in every step, and well inside the C++ test's tolerance
    info = {}
    lg32, _, g32 = loss_and_grads(c, {k: t.detach().float().requires_grad_(True) for k, t in p.items()}, x, y, info)
    l32, n32, f32, _, routes32 = train_steps(c, p, x, y, len(losses), torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(routes, routes32)), f"{c.name}: float32 routes differently"
    worst = max([max(rel_errors(lg32, logits))] + [max(rel_errors(g32[k], grads[k])) for k in grads] +
                [abs(a - b) / abs(b) for a, b in zip(l32 + n32, losses + norms)] +
                [max(rel_errors(*comparable(c, k, f32[k], final[k]))) for k in final])
    assert worst < 3e-6, f"{c.name}: a float32 run differs from float64 by {worst} (relative)"
    print(f"{c.name}: self-check ok: finite differences, float32 routes identically and is within {worst:.1e}")


def safetensors_bytes(tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, off = [], 0
    for name, t in tensors:
        b = np.ascontiguousarray(t.detach().to(torch.float32).numpy()).astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def run_case(c, out_dir):
    p = init_params(c)
    x, y = make_batch(c)
    info = {}
    logits, loss, grads = loss_and_grads(c, p, x, y, info)
    aux0, dropped0 = float(info["aux"]), info["dropped"]
    losses, norms, final, gap, routes = train_steps(c, p, x, y, N_STEPS)
    assert losses[0] == float(loss)
    assert gap > MIN_GAP, f"{c.name}: routing too close to a tie ({gap})"
    assert any(n > c.grad_clip for n in norms) and any(n < c.grad_clip for n in norms), \
        f"{c.name}: pick grad_clip so clipping triggers in some steps only: norms {norms}"
    assert (dropped0 > 0) == (c.capacity_factor > 0), f"{c.name}: dropped {dropped0}"
    self_check(c, p, x, y, logits, loss, grads, losses, norms, final, routes)

    specs = c.tensor_specs()
    file_t = lambda t, tr: t.T if tr else t  # GPT-2's Conv1D weights are [in, out] in the file
    keys = ["arch", "n_layer", "n_head", "d_model", "vocab_size", "max_seq_len", "num_experts", "top_k",
            "expert_ffn_dim", "every"]
    keys += ["n_kv_head", "ffn_dim"] if c.arch == "llama" else []
    meta = {k: str(getattr(c, k)) for k in keys}
    meta.update(aux_loss_coef=repr(c.aux_loss_coef), capacity_factor=repr(c.capacity_factor),
                num_params=str(sum(int(np.prod(s)) for _, s, _ in specs)), format="pt")
    if c.arch == "llama":
        meta.update(rope_theta=repr(c.rope_theta), norm_eps=repr(c.norm_eps))
    model_bytes = safetensors_bytes([(n, file_t(p[n], tr)) for n, _, tr in specs], meta)
    state_meta = dict(B=str(c.B), T=str(c.T), n_steps=str(N_STEPS), lr=repr(LR), beta1=repr(BETA1), beta2=repr(BETA2),
                      eps=repr(ADAM_EPS), weight_decay=repr(WD), grad_clip=repr(c.grad_clip))
    state = [("tokens", x.double()), ("targets", y.double()), ("logits", logits), ("loss", loss.reshape(1)),
             ("aux", torch.tensor([aux0])), ("dropped", torch.tensor([float(dropped0)])),
             ("losses", torch.tensor(losses)), ("grad_norms", torch.tensor(norms))]
    state += [("grad." + n, file_t(grads[n], tr)) for n, _, tr in specs]
    state += [("final." + n, file_t(final[n], tr)) for n, _, tr in specs]
    state_bytes = safetensors_bytes(state, state_meta)
    for suffix, data in (("model", model_bytes), ("state", state_bytes)):
        path = os.path.join(out_dir, f"{c.name}_{suffix}.safetensors")
        assert len(data) < 200 * 1024, f"{path}: {len(data)} bytes"
        with open(path, "wb") as f:
            f.write(data)
        print(f"wrote {path}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    print(f"{c.name}: aux {aux0:.9f}, dropped {dropped0}, min routing gap {gap:.2e}")
    print("  losses:", " ".join(f"{l:.9f}" for l in losses))
    print("  norms: ", " ".join(f"{n:.6f}" for n in norms))


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "test", "data")
    os.makedirs(out_dir, exist_ok=True)
    for d in CASES:
        run_case(Case(d), out_dir)


if __name__ == "__main__":
    main()
