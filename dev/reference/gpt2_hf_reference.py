#!/usr/bin/python3
"""Independent PyTorch GPT-2 in transformers' layout (GPT2LMHeadModel), and the files it writes.

Run with Debian's torch (python3-torch 1.13; transformers is not needed):
    /usr/bin/python3 dev/reference/gpt2_hf_reference.py [OUT_DIR]
It writes (deterministically: same bytes on every run), into test/data by default,
  gpt2_hf_model.safetensors   a tiny GPT-2 under transformers' names, F32, as GPT2LMHeadModel
                              stores it: Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc,
                              mlp.c_proj) are [in, out], so that y = x @ W + b; the vocabulary
                              unpadded; plus what transformers may save beside the weights: an
                              lm_head.weight equal to transformer.wte.weight (tied) and the
                              attn.bias causal-mask and attn.masked_bias buffers of each block.
                              __metadata__: n_layer, n_head, d_model, vocab_size, max_seq_len.
  gpt2_hf_state.safetensors   tokens and targets [B, T] (integers, exact in F32), logits [B, T, V]
                              and the mean cross-entropy loss [1] of the model on them. __metadata__: B, T.
and test/test_gpt2_hf.cpp loads the model through hf_read_weights (what model.init does with a
.safetensors file) and checks our CPU model's logits against these.

The forward is written here from GPT2LMHeadModel's definition (not from our C++): token +
position embeddings, per block x += c_proj(attn(ln_1(x))), x += mlp.c_proj(gelu_new(c_fc(ln_2(x)))),
LayerNorm eps 1e-5, causal attention scaled by 1/sqrt(head_dim), q/k/v the three C-wide slices
of c_attn's output, ln_f, logits = x @ wte^T. Weights are drawn in float32 and everything is
computed in float64. self_check() compares it with a second formulation (torch's layer_norm and
tanh GELU, one head at a time, weights used in PyTorch's Linear orientation).
"""
import hashlib
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from llama_reference import read_back, safetensors_bytes

torch.set_num_threads(1)  # fixed reduction order -> identical bytes on every run

L, NH, C, V, MAXT = 2, 4, 32, 61, 16  # V: the model pads it to 128
B, T = 2, 8
SEED = 1234
CONV1D_WEIGHTS = tuple(c + ".weight" for c in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))


def tensor_specs():
    """(transformers name, shape) of the parameters, in GPT2LMHeadModel's order."""
    specs = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (MAXT, C))]
    for l in range(L):
        p = f"transformer.h.{l}."
        specs += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                  (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                  (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                  (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                  (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                  (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    specs += [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
    return specs


def init_params():
    """float32 draws, returned as float64 tensors holding exact fp32 values. Biases and LayerNorm
    parameters are far from 0 and 1 so that a misplaced one shows in the logits."""
    g = torch.Generator().manual_seed(SEED)
    p = {}
    for name, shape in tensor_specs():
        r = torch.randn(*shape, generator=g, dtype=torch.float32)
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            p[name] = 1.0 + 0.2 * r
        elif name.endswith("bias"):
            p[name] = 0.1 * r
        elif name.endswith(("wte.weight", "wpe.weight")):
            p[name] = 0.3 * r
        else:
            p[name] = 0.15 * r
    return {k: v.to(torch.float64) for k, v in p.items()}


def make_batch():
    g = torch.Generator().manual_seed(SEED + 1)
    seq = torch.randint(0, V, (B * T + 1,), generator=g, dtype=torch.int64)
    seq[3] = V - 1  # the last real vocabulary row, as input and as target
    return seq[:-1].view(B, T).clone(), seq[1:].view(B, T).clone()


def layer_norm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def conv1d(x, p, name):
    return x @ p[name + ".weight"] + p[name + ".bias"]  # weight [in, out]


def forward(p, x):
    Tn = x.shape[1]
    h = p["transformer.wte.weight"][x] + p["transformer.wpe.weight"][:Tn]
    HS = C // NH
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(L):
        pre = f"transformer.h.{l}."
        qkv = conv1d(layer_norm(h, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"]), p, pre + "attn.c_attn")
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, Tn, NH, HS).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, Tn, C)
        h = h + conv1d(y, p, pre + "attn.c_proj")
        m = conv1d(layer_norm(h, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"]), p, pre + "mlp.c_fc")
        h = h + conv1d(gelu_new(m), p, pre + "mlp.c_proj")
    h = layer_norm(h, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    return h @ p["transformer.wte.weight"].T


def forward_alt(p, x):
    """The same model another way: Linear-oriented weights, torch's ops, one head at a time."""
    Tn = x.shape[1]
    HS = C // NH
    lin = {n[:-len(".weight")]: w.T.contiguous() for n, w in p.items() if n.endswith(CONV1D_WEIGHTS)}
    h = F.embedding(x, p["transformer.wte.weight"]) + F.embedding(torch.arange(Tn), p["transformer.wpe.weight"])
    for l in range(L):
        pre = f"transformer.h.{l}."
        a = F.layer_norm(h, (C,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], 1e-5)
        qkv = F.linear(a, lin[pre + "attn.c_attn"], p[pre + "attn.c_attn.bias"])
        heads = []
        for hd in range(NH):
            q = qkv[..., hd * HS:(hd + 1) * HS]
            k = qkv[..., C + hd * HS:C + (hd + 1) * HS]
            v = qkv[..., 2 * C + hd * HS:2 * C + (hd + 1) * HS]
            s = torch.einsum("btd,bsd->bts", q, k) * HS ** -0.5
            s = s + torch.triu(torch.full((Tn, Tn), float("-inf"), dtype=s.dtype), diagonal=1)
            heads.append(torch.einsum("bts,bsd->btd", torch.softmax(s, -1), v))
        h = h + F.linear(torch.cat(heads, -1), lin[pre + "attn.c_proj"], p[pre + "attn.c_proj.bias"])
        m = F.layer_norm(h, (C,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], 1e-5)
        m = F.gelu(F.linear(m, lin[pre + "mlp.c_fc"], p[pre + "mlp.c_fc.bias"]), approximate="tanh")
        h = h + F.linear(m, lin[pre + "mlp.c_proj"], p[pre + "mlp.c_proj.bias"])
    h = F.layer_norm(h, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
    return F.linear(h, p["transformer.wte.weight"])


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "test", "data")
    os.makedirs(out_dir, exist_ok=True)
    p = init_params()
    x, y = make_batch()
    logits = forward(p, x)
    loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
    err = (logits - forward_alt(p, x)).abs().max().item() / logits.abs().max().item()
    assert err < 1e-12, f"the two forwards differ by {err} (relative)"
    print(f"self-check ok: alternative forward within {err:.1e} (relative max)")

    specs = tensor_specs()
    model = [(n, p[n]) for n, _ in specs]
    model.append(("lm_head.weight", p["transformer.wte.weight"]))  # tied, saved as transformers may
    for l in range(L):  # the buffers GPT2Attention registers (older transformers save them)
        model.append((f"transformer.h.{l}.attn.bias", torch.tril(torch.ones(MAXT, MAXT)).view(1, 1, MAXT, MAXT)))
        model.append((f"transformer.h.{l}.attn.masked_bias", torch.tensor(-1e4)))
    meta = dict(n_layer=str(L), n_head=str(NH), d_model=str(C), vocab_size=str(V), max_seq_len=str(MAXT), format="pt")
    model_bytes = safetensors_bytes(model, meta)
    state_meta = dict(B=str(B), T=str(T))
    state_bytes = safetensors_bytes([("tokens", x.double()), ("targets", y.double()), ("logits", logits),
                                     ("loss", loss.reshape(1))], state_meta)
    back, m = read_back(model_bytes)
    assert m == meta and all(np.array_equal(back[n], p[n].float().numpy()) for n, _ in specs)
    assert back["transformer.h.0.attn.c_attn.weight"].shape == (C, 3 * C)
    for suffix, data in (("model", model_bytes), ("state", state_bytes)):
        path = os.path.join(out_dir, f"gpt2_hf_{suffix}.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        print(f"wrote {path}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    print(f"GPT-2 L={L} NH={NH} C={C} V={V} maxT={MAXT}, batch {B}x{T}, loss {loss.item():.9f}")


if __name__ == "__main__":
    main()
