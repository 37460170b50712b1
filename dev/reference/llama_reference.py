#!/usr/bin/python3
"""Independent float64 PyTorch reference for train_gpt's Llama, and the parity files it writes.

Run with Debian's torch (python3-torch 1.13; transformers is not used):
    /usr/bin/python3 dev/reference/llama_reference.py [out_dir]
It writes, deterministically (same bytes on every run), for each case in CASES:
  test/data/<case>_model.safetensors   the initial weights under transformers' names, F32
  test/data/<case>_state.safetensors   the batch, and what the model does with it (below)
and test/test_llama_parity.cpp checks the C++ CPU backend against them.

Model: transformers' LlamaForCausalLM, written here from its definition:
  h = embed_tokens[x]
  per layer:  h = h + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),  n = rmsnorm(h, input_layernorm)
              h = h + down_proj(silu(gate_proj(n)) * up_proj(n)),                  n = rmsnorm(h, post_attention_layernorm)
  logits = lm_head(rmsnorm(h, norm))   (lm_head = embed_tokens when tie_embeddings)
  rmsnorm(x, w) = w * x / sqrt(mean(x^2) + norm_eps)
  rope: inv_freq[i] = theta^(-2i/HS), i < HS/2; angle[t] = t * [inv_freq, inv_freq] (concatenated);
        q' = q * cos(angle) + rotate_half(q) * sin(angle), rotate_half([a, b]) = [-b, a]; same for k
  attention: causal, softmax(q k^T / sqrt(HS)); query head h reads kv head h // (n_head / n_kv_head)
  loss = mean cross-entropy over the B*T tokens; no biases anywhere.
Weights are drawn in float32 (so the stored F32 weights are exact) and everything is then
computed in float64. Init: N(0, 0.02) for the embedding, head, o_proj, v_proj and down_proj;
two deliberate changes so that a wrong code path cannot hide in this tiny model:
  - q_proj and k_proj are drawn with std 0.15, so attention scores are O(1) and the softmax is
    far from uniform (a wrong rope convention, scale, mask or kv-head mapping shows clearly);
  - gate_proj and up_proj are drawn with std 0.15, so SiLU's inputs are O(1);
and the norm weights are 1 + 0.1 N(0, 1) (so their gradients are exercised).

Optimizer: AdamW by hand (cross-checked against torch.optim.AdamW + clip_grad_norm_):
  g <- g * coef,  coef = min(1, grad_clip / (global_norm + 1e-6))
  m <- b1 m + (1-b1) g;   v <- b2 v + (1-b2) g^2
  p <- p - lr * ((m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd_p * p)
wd_p = weight_decay for every 2-D weight (embedding and head included), 0 for the norm weights.
global_norm is over all gradients before clipping. Every step uses the same batch; losses[k]
is the loss before update k+1, grad_norms[k] the norm of that step's gradients.

<case>_model.safetensors: every weight under its transformers name (no lm_head.weight when tied;
real vocabulary rows only), F32. __metadata__ (strings): n_layer, n_head, n_kv_head, d_model,
ffn_dim, vocab_size, max_seq_len, rope_theta, norm_eps, tie_embeddings ("true"/"false"),
num_params (elements of all tensors in the file), format "pt".
<case>_state.safetensors, F32: tokens [B, T], targets [B, T] (integers, exact in F32),
logits [B, T, V], loss [1], grad.<name> (d loss / d weight, same shape as the weight) for every
weight, losses [n_steps], grad_norms [n_steps], final.<name> (every weight after n_steps updates).
__metadata__: B, T, n_steps, lr, beta1, beta2, eps, weight_decay, grad_clip.
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

torch.set_num_threads(1)  # fixed reduction order -> identical bytes on every run

CASES = [
    dict(name="llama_gqa", seed=4242, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_dim=48, vocab_size=61,
         max_seq_len=16, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False, B=2, T=8, grad_clip=2.0),
    dict(name="llama_mqa_tied", seed=777, n_layer=2, n_head=4, n_kv_head=1, d_model=32, ffn_dim=40, vocab_size=61,
         max_seq_len=16, rope_theta=500000.0, norm_eps=1e-6, tie_embeddings=True, B=2, T=8, grad_clip=2.5),
]
N_STEPS = 10
LR, BETA1, BETA2, ADAM_EPS, WD = 1e-3, 0.9, 0.95, 1e-8, 0.1


class Case:
    def __init__(self, d):
        self.__dict__.update(d)
        assert self.d_model % self.n_head == 0 and self.n_head % self.n_kv_head == 0
        self.HS = self.d_model // self.n_head

    def tensor_specs(self):
        """(transformers name, shape, decay) in the order the model file lists them."""
        C, F_, HS, V = self.d_model, self.ffn_dim, self.HS, self.vocab_size
        Q, KV = self.n_head * HS, self.n_kv_head * HS
        specs = [("model.embed_tokens.weight", (V, C), True)]
        for l in range(self.n_layer):
            p = f"model.layers.{l}."
            specs += [(p + "input_layernorm.weight", (C,), False),
                      (p + "self_attn.q_proj.weight", (Q, C), True),
                      (p + "self_attn.k_proj.weight", (KV, C), True),
                      (p + "self_attn.v_proj.weight", (KV, C), True),
                      (p + "self_attn.o_proj.weight", (C, Q), True),
                      (p + "post_attention_layernorm.weight", (C,), False),
                      (p + "mlp.gate_proj.weight", (F_, C), True),
                      (p + "mlp.up_proj.weight", (F_, C), True),
                      (p + "mlp.down_proj.weight", (C, F_), True)]
        specs.append(("model.norm.weight", (C,), False))
        if not self.tie_embeddings:
            specs.append(("lm_head.weight", (V, C), True))
        return specs


def init_params(c):
    """float32 draws (see the module docstring), returned as float64 leaves holding exact fp32 values."""
    g = torch.Generator().manual_seed(c.seed)
    p = {}
    for name, shape, _ in c.tensor_specs():
        r = torch.randn(*shape, generator=g, dtype=torch.float32)
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            p[name] = 1.0 + 0.1 * r
        elif name.endswith(("q_proj.weight", "k_proj.weight", "gate_proj.weight", "up_proj.weight")):
            p[name] = 0.15 * r
        else:
            p[name] = 0.02 * r
    return {k: v.to(torch.float64).requires_grad_(True) for k, v in p.items()}


def make_batch(c):
    g = torch.Generator().manual_seed(c.seed + 1)
    seq = torch.randint(0, c.vocab_size, (c.B * c.T + 1,), generator=g, dtype=torch.int64)
    seq[3] = c.vocab_size - 1  # the last real vocabulary row, as input and as target
    seq[5] = 0
    x = seq[:-1].view(c.B, c.T).clone()
    y = seq[1:].view(c.B, c.T).clone()
    return x, y


# ---------------------------------------------------------------- model (hand-written ops)
def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(T, HS, theta, dtype):
    inv_freq = 1.0 / theta ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([ang, ang], dim=-1)  # [T, HS]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def forward(c, p, x, y):
    """Returns (logits [B, T, V], mean loss)."""
    Bq, Tq = x.shape
    NH, NKV, HS = c.n_head, c.n_kv_head, c.HS
    emb = p["model.embed_tokens.weight"]
    cos, sin = rope_cos_sin(Tq, HS, c.rope_theta, emb.dtype)
    mask = torch.ones(Tq, Tq, dtype=torch.bool).tril()
    h = emb[x]
    for l in range(c.n_layer):
        w = lambda n: p[f"model.layers.{l}.{n}.weight"]
        a = rmsnorm(h, w("input_layernorm"), c.norm_eps)
        q = (a @ w("self_attn.q_proj").T).view(Bq, Tq, NH, HS).transpose(1, 2)
        k = (a @ w("self_attn.k_proj").T).view(Bq, Tq, NKV, HS).transpose(1, 2)
        v = (a @ w("self_attn.v_proj").T).view(Bq, Tq, NKV, HS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)  # query head h -> kv head h // (NH / NKV)
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(~mask, float("-inf"))
        att = (att - att.amax(-1, keepdim=True)).exp()
        att = att / att.sum(-1, keepdim=True)
        o = (att @ v).transpose(1, 2).reshape(Bq, Tq, NH * HS)
        h = h + o @ w("self_attn.o_proj").T
        m = rmsnorm(h, w("post_attention_layernorm"), c.norm_eps)
        gate = m @ w("mlp.gate_proj").T
        h = h + (gate * torch.sigmoid(gate) * (m @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T
    h = rmsnorm(h, p["model.norm.weight"], c.norm_eps)
    logits = h @ (emb if c.tie_embeddings else p["lm_head.weight"]).T
    lg = logits.reshape(-1, c.vocab_size)
    loss = (torch.logsumexp(lg, dim=-1) - lg.gather(1, y.reshape(-1, 1)).squeeze(1)).mean()
    return logits, loss


def forward_alt(c, p, x, y):
    """The same model written another way: rotary positions as Meta's original complex
    rotation of interleaved pairs (on q/k weights whose rows are permuted from transformers'
    half-split layout to the interleaved one: scores are invariant under a common permutation
    of q and k), attention one query head at a time reading kv head h // group, torch's softmax,
    F.silu, F.embedding, F.linear and F.cross_entropy."""
    Bq, Tq = x.shape
    NH, NKV, HS = c.n_head, c.n_kv_head, c.HS
    group = NH // NKV
    # row order within a head: interleaved position 2i <- half-split i, 2i+1 <- half-split i + HS/2
    perm = torch.stack([torch.arange(HS // 2), torch.arange(HS // 2) + HS // 2], dim=1).reshape(-1)
    inv_freq = torch.tensor([c.rope_theta ** (-2.0 * i / HS) for i in range(HS // 2)], dtype=torch.float64)
    freqs = torch.polar(torch.ones(Tq, HS // 2, dtype=torch.float64),
                        torch.arange(Tq, dtype=torch.float64)[:, None] * inv_freq[None, :])  # [T, HS/2]

    def rotary(t, n_heads, weight):
        w = weight.view(n_heads, HS, -1)[:, perm, :].reshape(n_heads * HS, -1)
        z = F.linear(t, w).view(Bq, Tq, n_heads, HS // 2, 2)
        z = torch.view_as_complex(z.contiguous()) * freqs[None, :, None, :]
        return torch.view_as_real(z).reshape(Bq, Tq, n_heads, HS)

    def norm(t, w):
        return w * (t / torch.sqrt((t * t).mean(-1, keepdim=True) + c.norm_eps))

    causal = torch.triu(torch.ones(Tq, Tq, dtype=torch.bool), diagonal=1)
    h = F.embedding(x, p["model.embed_tokens.weight"])
    for l in range(c.n_layer):
        w = lambda n: p[f"model.layers.{l}.{n}.weight"]
        a = norm(h, w("input_layernorm"))
        q = rotary(a, NH, w("self_attn.q_proj"))
        k = rotary(a, NKV, w("self_attn.k_proj"))
        v = F.linear(a, w("self_attn.v_proj")).view(Bq, Tq, NKV, HS)
        heads = []
        for hq in range(NH):
            kv = hq // group
            s = torch.einsum("btd,bsd->bts", q[:, :, hq], k[:, :, kv]) / math.sqrt(HS)
            s = torch.softmax(s.masked_fill(causal, float("-inf")), dim=-1)
            heads.append(torch.einsum("bts,bsd->btd", s, v[:, :, kv]))
        h = h + F.linear(torch.cat(heads, dim=-1), w("self_attn.o_proj"))
        m = norm(h, w("post_attention_layernorm"))
        h = h + F.linear(F.silu(F.linear(m, w("mlp.gate_proj"))) * F.linear(m, w("mlp.up_proj")), w("mlp.down_proj"))
    h = norm(h, p["model.norm.weight"])
    logits = F.linear(h, p["model.embed_tokens.weight"] if c.tie_embeddings else p["lm_head.weight"])
    return logits, F.cross_entropy(logits.reshape(-1, c.vocab_size), y.reshape(-1))


def loss_and_grads(c, p, x, y):
    for t in p.values():
        t.grad = None
    logits, loss = forward(c, p, x, y)
    loss.backward()
    return logits.detach(), loss.detach(), {k: t.grad.detach().clone() for k, t in p.items()}


# ---------------------------------------------------------------- AdamW (by hand)
def train_steps(c, p0, x, y, n_steps, dtype=torch.float64):
    """Returns (losses, grad norms, final weights); dtype float32 only for the sensitivity check."""
    decay = {n: d for n, _, d in c.tensor_specs()}
    p = {k: t.detach().to(dtype).clone().requires_grad_(True) for k, t in p0.items()}
    m = {k: torch.zeros_like(t) for k, t in p.items()}
    v = {k: torch.zeros_like(t) for k, t in p.items()}
    losses, norms = [], []
    for step in range(1, n_steps + 1):
        _, loss, grads = loss_and_grads(c, p, x, y)
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
    return losses, norms, {k: t.detach() for k, t in p.items()}


def train_steps_torch(c, p0, x, y, n_steps):
    """train_steps with torch.optim.AdamW and clip_grad_norm_, for the self-check."""
    decay = {n: d for n, _, d in c.tensor_specs()}
    p = {k: t.detach().clone().requires_grad_(True) for k, t in p0.items()}
    groups = [{"params": [p[k] for k in p if decay[k]], "weight_decay": WD},
              {"params": [p[k] for k in p if not decay[k]], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(BETA1, BETA2), eps=ADAM_EPS)
    losses = []
    for _ in range(n_steps):
        opt.zero_grad(set_to_none=True)
        _, loss = forward(c, p, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), c.grad_clip)
        losses.append(float(loss))
        opt.step()
    return losses, {k: t.detach() for k, t in p.items()}


def rel_errors(a, b):
    """The C++ test's metric: (||a-b|| / ||b||, max|a-b| / max|b|)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm()), float((a - b).abs().max() / b.abs().max())


# ---------------------------------------------------------------- self checks
def self_check(c, p, x, y, logits, loss, grads, losses, norms, final):
    # 1. the hand-written model against the alternative formulation
    with torch.no_grad():
        lg2, loss2 = forward_alt(c, p, x, y)
    err = float((lg2 - logits).abs().max())
    assert err < 1e-12, f"{c.name}: forward_alt logits differ by {err}"
    assert abs(float(loss2) - float(loss)) < 1e-12, f"{c.name}: forward_alt loss differs"

    # 2. autograd against central finite differences on a few entries of every tensor kind
    tok = int(x[0, 1])
    probes = [("model.embed_tokens.weight", (tok, 3)), ("model.embed_tokens.weight", (int(y[1, 2]), 5)),
              ("model.norm.weight", (17,))]
    probes += [("lm_head.weight", (int(y[0, 4]), 9)), ("lm_head.weight", (c.vocab_size - 1, 2))] \
        if not c.tie_embeddings else [("model.embed_tokens.weight", (c.vocab_size - 2, 7))]
    for l in range(c.n_layer):
        pre = f"model.layers.{l}."
        probes += [(pre + "input_layernorm.weight", (5 + l,)), (pre + "self_attn.q_proj.weight", (13, 2 + l)),
                   (pre + "self_attn.k_proj.weight", (3 + l, 30)), (pre + "self_attn.v_proj.weight", (6, 11 + l)),
                   (pre + "self_attn.o_proj.weight", (21, 9 + l)), (pre + "post_attention_layernorm.weight", (8,)),
                   (pre + "mlp.gate_proj.weight", (30 + l, 4)), (pre + "mlp.up_proj.weight", (11, 19 + l)),
                   (pre + "mlp.down_proj.weight", (2 + l, 37))]
    h = 1e-6
    with torch.no_grad():
        for name, idx in probes:
            t = p[name]
            orig = float(t[idx])
            t[idx] = orig + h
            lp = float(forward(c, p, x, y)[1])
            t[idx] = orig - h
            lm = float(forward(c, p, x, y)[1])
            t[idx] = orig
            fd = (lp - lm) / (2 * h)
            ag = float(grads[name][idx])
            assert abs(fd - ag) <= 1e-8 + 1e-5 * abs(ag), f"{c.name}: finite difference {name}{idx}: {fd} vs {ag}"

    # 3. the hand-written AdamW against torch.optim.AdamW
    losses2, final2 = train_steps_torch(c, p, x, y, len(losses))
    d = max(abs(a - b) for a, b in zip(losses, losses2))
    dw = max(float((final[k] - final2[k]).abs().max()) for k in final)
    assert d < 1e-12 and dw < 1e-12, f"{c.name}: manual AdamW differs from torch.optim.AdamW: {d}, {dw}"

    # 4. the data is well conditioned for an fp32 implementation: the same run in float32 stays
    #    well inside the C++ test's tolerance (1e-5) for logits, gradients, losses, norms, weights
    lg32, _, g32 = loss_and_grads(c, {k: t.detach().float().requires_grad_(True) for k, t in p.items()}, x, y)
    l32, n32, f32 = train_steps(c, p, x, y, len(losses), torch.float32)
    worst = max([max(rel_errors(lg32, logits))] + [max(rel_errors(g32[k], grads[k])) for k in grads] +
                [abs(a - b) / abs(b) for a, b in zip(l32 + n32, losses + norms)] +
                [max(rel_errors(f32[k], final[k])) for k in final])
    assert worst < 2e-6, f"{c.name}: a float32 run differs from float64 by {worst} (relative)"
    print(f"{c.name}: self-check ok: alt forward |dlogits| {err:.1e}, {len(probes)} finite differences, "
          f"AdamW vs torch.optim {max(d, dw):.1e}, float32 run within {worst:.1e}")


# ---------------------------------------------------------------- files
def safetensors_bytes(tensors, metadata):
    """tensors: (name, float tensor) in order, stored as little-endian F32; metadata: str -> str."""
    header = {"__metadata__": metadata}
    blobs, off = [], 0
    for name, t in tensors:
        b = np.ascontiguousarray(t.detach().to(torch.float32).numpy()).astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the data section starts 8-byte aligned
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def read_back(data):
    """A minimal independent parse of safetensors_bytes' output (a check of the writer)."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__")
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + end], dtype="<f4").reshape(e["shape"])
    assert 8 + n + max(e["data_offsets"][1] for e in header.values()) == len(data)
    return out, meta


def run_case(c, out_dir):
    p = init_params(c)
    x, y = make_batch(c)
    logits, loss, grads = loss_and_grads(c, p, x, y)
    losses, norms, final = train_steps(c, p, x, y, N_STEPS)
    assert losses[0] == float(loss)
    assert any(n > c.grad_clip for n in norms) and any(n < c.grad_clip for n in norms), \
        f"{c.name}: pick grad_clip so clipping triggers in some steps only: norms {norms}"
    self_check(c, p, x, y, logits, loss, grads, losses, norms, final)

    specs = c.tensor_specs()
    num_params = sum(int(np.prod(s)) for _, s, _ in specs)
    model_meta = {k: str(getattr(c, k)) for k in ("n_layer", "n_head", "n_kv_head", "d_model", "ffn_dim",
                                                   "vocab_size", "max_seq_len")}
    model_meta.update(rope_theta=repr(c.rope_theta), norm_eps=repr(c.norm_eps),
                      tie_embeddings="true" if c.tie_embeddings else "false", num_params=str(num_params), format="pt")
    model_bytes = safetensors_bytes([(n, p[n]) for n, _, _ in specs], model_meta)

    state_meta = dict(B=str(c.B), T=str(c.T), n_steps=str(N_STEPS), lr=repr(LR), beta1=repr(BETA1), beta2=repr(BETA2),
                      eps=repr(ADAM_EPS), weight_decay=repr(WD), grad_clip=repr(c.grad_clip))
    state = [("tokens", x.double()), ("targets", y.double()), ("logits", logits),
             ("loss", loss.reshape(1)), ("losses", torch.tensor(losses)), ("grad_norms", torch.tensor(norms))]
    state += [("grad." + n, grads[n]) for n, _, _ in specs]
    state += [("final." + n, final[n]) for n, _, _ in specs]
    state_bytes = safetensors_bytes(state, state_meta)

    back, meta = read_back(model_bytes)
    assert meta == model_meta and all(np.array_equal(back[n], p[n].detach().float().numpy()) for n, _, _ in specs)
    back, meta = read_back(state_bytes)
    assert meta == state_meta and np.array_equal(back["tokens"], x.float().numpy())

    for suffix, data in (("model", model_bytes), ("state", state_bytes)):
        path = os.path.join(out_dir, f"{c.name}_{suffix}.safetensors")
        assert len(data) < 200 * 1024, f"{path}: {len(data)} bytes"
        with open(path, "wb") as f:
            f.write(data)
        print(f"wrote {path}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    print(f"{c.name}: L={c.n_layer} NH={c.n_head} NKV={c.n_kv_head} C={c.d_model} F={c.ffn_dim} V={c.vocab_size} "
          f"maxT={c.max_seq_len} theta={c.rope_theta} eps={c.norm_eps} tied={c.tie_embeddings} B={c.B} T={c.T}, "
          f"{num_params} params")
    print(f"  AdamW lr={LR} betas=({BETA1},{BETA2}) eps={ADAM_EPS} wd={WD} (2-D weights) grad_clip={c.grad_clip}")
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
