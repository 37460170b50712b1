"""Checks a run's Hugging Face export end to end: the exported weights, loaded by transformers
(AutoModelForCausalLM.from_pretrained, as a user would) or by this folder's independent float64
forward (--engine reference, no transformers needed), give the validation loss the trainer logged
at its last step, computed from the same weights.

    python3 dev/reference/check_export.py OUT_DIR VAL_SHARD --batch B --seq T [--batches N]
                                          [--engine transformers|reference] [--tol 1e-5]

OUT_DIR holds config.json, model_<steps>.safetensors and log.jsonl of a run with out.format hf or
both; VAL_SHARD is the first shard of its data.val (the validation loader reads its first N windows
of B x T + 1 tokens from the start, unshuffled). Exit 0 when the losses agree to --tol (relative).
Used by scripts/gpu_check.sh's env stage, where transformers is installed.
"""
import argparse
import glob
import json
import math
import os
import shutil
import struct
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def read_shard(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        data = f.read()
    magic, version, n = header[0], header[1], header[2]
    width = {(20240520, 1): 2, (20240801, 7): 4}.get((magic, version))
    if width is None:
        sys.exit(f"{path}: not a token shard (magic {magic}, version {version})")
    fmt = "<%d%s" % (n, "H" if width == 2 else "I")
    return torch.tensor(struct.unpack(fmt, data[: n * width]), dtype=torch.int64)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, e in header.items():
            if name == "__metadata__":
                continue
            assert e["dtype"] == "F32", f"{name}: {e['dtype']}"
            b, end = e["data_offsets"]
            f.seek(base + b)
            t = torch.frombuffer(bytearray(f.read(end - b)), dtype=torch.float32)
            out[name] = t.view(*e["shape"]).to(torch.float64)
    return out


def gpt2_forward(cfg, p, x):
    """GPT2LMHeadModel in float64 from transformers' tensors (Conv1D weights are [in, out])."""
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    pre = "transformer." if "transformer.wte.weight" in p else ""
    B, T = x.shape
    HS = C // NH

    def ln(h, n):
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        return (h - mu) / torch.sqrt(var + cfg.get("layer_norm_epsilon", 1e-5)) * p[n + ".weight"] + p[n + ".bias"]

    def conv(h, n):
        return h @ p[n + ".weight"] + p[n + ".bias"]

    h = p[pre + "wte.weight"][x] + p[pre + "wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        b = f"{pre}h.{l}."
        q, k, v = conv(ln(h, b + "ln_1"), b + "attn.c_attn").split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-1, -2)) / math.sqrt(HS)).masked_fill(~mask, float("-inf")).softmax(-1)
        h = h + conv((att @ v).transpose(1, 2).reshape(B, T, C), b + "attn.c_proj")
        m = conv(ln(h, b + "ln_2"), b + "mlp.c_fc")
        m = 0.5 * m * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (m + 0.044715 * m ** 3)))
        h = h + conv(m, b + "mlp.c_proj")
    return ln(h, pre + "ln_f") @ p[pre + "wte.weight"].T


def reference_logits(cfg, p, x, y):
    arch = cfg["architectures"][0]
    if arch == "GPT2LMHeadModel":
        return gpt2_forward(cfg, p, x)
    if arch == "LlamaForCausalLM":
        import llama_reference as lr
        c = lr.Case(dict(n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"],
                         n_kv_head=cfg["num_key_value_heads"], d_model=cfg["hidden_size"],
                         ffn_dim=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
                         rope_theta=cfg["rope_theta"], norm_eps=cfg["rms_norm_eps"],
                         tie_embeddings=cfg["tie_word_embeddings"]))
        return lr.forward(c, p, x, y)[0]
    sys.exit(f"unknown architecture {arch}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("val_shard")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batches", type=int, default=1)
    ap.add_argument("--engine", choices=["transformers", "reference"], default="transformers")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()

    cfg = json.load(open(os.path.join(a.out_dir, "config.json")))
    weights = sorted(glob.glob(os.path.join(a.out_dir, "model_*.safetensors")))
    if not weights:
        sys.exit(f"{a.out_dir}: no model_<steps>.safetensors (run with out.format hf or both)")
    logged = [json.loads(l) for l in open(os.path.join(a.out_dir, "log.jsonl"))]
    logged = [r["val_loss"] for r in logged if "val_loss" in r]
    if not logged:
        sys.exit(f"{a.out_dir}/log.jsonl: no val_loss record")
    tokens = read_shard(a.val_shard)
    n = a.batch * a.seq

    if a.engine == "transformers":
        from transformers import AutoModelForCausalLM
        tmp = tempfile.mkdtemp()
        shutil.copy(os.path.join(a.out_dir, "config.json"), tmp)
        shutil.copy(weights[-1], os.path.join(tmp, "model.safetensors"))
        model = AutoModelForCausalLM.from_pretrained(tmp, torch_dtype=torch.float64).eval()
        shutil.rmtree(tmp)
        logits_of = lambda x, y: model(x).logits
    else:
        p = read_safetensors(weights[-1])
        logits_of = lambda x, y: reference_logits(cfg, p, x, y)

    losses = []
    with torch.no_grad():
        for w in range(a.batches):
            seq = tokens[w * n: w * n + n + 1]
            x, y = seq[:-1].view(a.batch, a.seq), seq[1:].view(a.batch, a.seq)
            lg = logits_of(x, y).reshape(n, -1).to(torch.float64)
            losses.append((torch.logsumexp(lg, -1) - lg.gather(1, y.reshape(-1, 1)).squeeze(1)).mean().item())
    ours, theirs = logged[-1], sum(losses) / len(losses)
    rel = abs(ours - theirs) / abs(ours)
    print(f"{cfg['architectures'][0]} via {a.engine}: val loss {theirs:.9f}, train_gpt logged {ours:.9f}, "
          f"relative difference {rel:.2e} (tolerance {a.tol:g})")
    sys.exit(0 if rel <= a.tol else 1)


if __name__ == "__main__":
    main()
