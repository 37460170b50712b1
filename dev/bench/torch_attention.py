"""PyTorch's causal attention beside dev/cuda/attention_{forward,backward} (issue 30's peer).

    python3 dev/bench/torch_attention.py B T NH HS [B T NH HS ...]

For each shape: torch.nn.functional.scaled_dot_product_attention(is_causal=True) on bf16 CUDA
tensors [B, NH, T, HS] (PyTorch picks its flash kernel), the median of 20 timed runs after 3
warm-up runs, with CUDA events; FLOPs counted as FlashAttention counts them (forward
4 B NH HS T^2 / 2 causal, backward 2.5 x that). One line per shape:

    TORCH_ATTN B=8 T=1024 NH=32 HS=64 fwd_ms=... fwd_tflops=... bwd_ms=... bwd_tflops=... backend=...
"""
import statistics
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, warmup=3, repeats=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench(B, T, NH, HS):
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, generator=gen)
    fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    flops = 4.0 * B * NH * HS * T * T / 2
    backend = "flash" if torch.backends.cuda.flash_sdp_enabled() else "other"
    print(f"TORCH_ATTN B={B} T={T} NH={NH} HS={HS} fwd_ms={fwd:.4f} fwd_tflops={flops / fwd * 1e-9:.1f} "
          f"bwd_ms={bwd:.4f} bwd_tflops={2.5 * flops / bwd * 1e-9:.1f} backend={backend} torch={torch.__version__}",
          flush=True)


def main():
    args = [int(a) for a in sys.argv[1:]]
    if not args or len(args) % 4:
        sys.exit("usage: torch_attention.py B T NH HS [B T NH HS ...]")
    if not torch.cuda.is_available():
        sys.exit("torch_attention.py: no CUDA device")
    for i in range(0, len(args), 4):
        bench(*args[i:i + 4])


if __name__ == "__main__":
    main()
