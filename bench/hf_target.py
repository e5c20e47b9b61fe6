#!/usr/bin/env python3
"""Hugging Face transformers baseline for bench/bench_target.c: the target forward of a
Qwen3-8B-shaped model (random init from the same config: no weights needed), bf16,
attn_implementation="sdpa", on the same GPU and the same batches, reporting tokens/s and
MFU with the same FLOP count, so draftline's speed can be reported as a ratio.

Batches (T = --tokens, default 65,536 tokens):
  16x4096: input_ids (T/4096, 4096) (16 x 4096 at 65,536), no padding (sdpa's causal path).
  mixed:  --lengths (comma-separated; bench_target prints its mixed batch's lengths on a
          "mixed lengths:" line, so both run the very same batch), else lengths drawn
          uniform in 128..4096 by numpy with a fixed seed summing to T; right-padded to the
          longest and run as one batch with an attention mask: what HF does with variable
          lengths under sdpa (FLOPs and tokens/s count the real tokens only).
Forward: the base model (Qwen3Model: 36 layers + final norm, no LM head) with
output_hidden_states=True (the hidden-state capture DFlash needs), under torch.no_grad().
FLOPs = 36 * (2 * T * P_layer + 4 * hd * H * sum_s L_s (L_s + 1) / 2), as bench_target's
"full" mode. MFU against a bf16 8192^3 torch.matmul measured in the same run (random data).
Times: CUDA events, median of --reps forwards after one warm-up.

Usage (on the GPU machine): python3 bench/hf_target.py [--tokens 65536] [--reps 3] [--lengths a,b,...]
"""
import argparse
import statistics
import sys

import torch


def qwen3_8b_config():
    from transformers import Qwen3Config
    return Qwen3Config(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False,
        torch_dtype="bfloat16")


def time_ms(fn, reps, warm=1):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts)


def gemm_peak():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: a @ b.T, 20, warm=5)
    tf = 2 * n ** 3 / (ms * 1e-3) / 1e12
    print(f"GEMM peak (torch bf16 matmul, 8192^3, random data): {ms:.3f} ms = {tf:.1f} TFLOP/s")
    return tf


def mixed_lengths(T, seed=7):
    import numpy as np
    rng = np.random.default_rng(seed)
    lens, tot = [], 0
    while tot < T:
        n = int(rng.integers(128, 4097))
        left = T - tot
        if left - n < 128:
            n = left
        if n > 4096:
            n = left // 2
        lens.append(n)
        tot += n
    return lens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lengths", default="", help="mixed batch lengths, comma-separated")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: hf_target: no CUDA device")
        return 0
    import transformers
    from transformers import Qwen3Model
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name(0)}")
    peak = gemm_peak()
    cfg = qwen3_8b_config()
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3Model(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    print(f"attention: {model.config._attn_implementation}; "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f} B params (no LM head)")
    D, H, Hkv, hd, F, L = 4096, 32, 8, 128, 12288, 36
    p_layer = D * (H * hd + 2 * Hkv * hd) + H * hd * D + 3 * D * F
    T = args.tokens
    g = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for name in (f"{T // 4096}x4096", "mixed"):
        if name != "mixed":
            lens = [4096] * (T // 4096)
        elif args.lengths:
            lens = [int(x) for x in args.lengths.split(",") if x]
        else:
            lens = mixed_lengths(T)
        if sum(lens) != T:
            print(f"hf_target: {name} lengths sum to {sum(lens)}, not {T}")
            return 1
        n, mx = len(lens), max(lens)
        ids = torch.randint(0, cfg.vocab_size, (n, mx), device="cuda", generator=g)
        mask = None
        if name == "mixed":
            mask = torch.zeros(n, mx, dtype=torch.long, device="cuda")
            for i, l in enumerate(lens):
                mask[i, :l] = 1
        pairs = sum(l * (l + 1) / 2 for l in lens)
        flops = L * (2.0 * T * p_layer + 4.0 * hd * H * pairs)

        def fwd():
            with torch.no_grad():
                out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                            use_cache=False)
            return out

        torch.cuda.reset_peak_memory_stats()
        ms = time_ms(fwd, args.reps)
        tf = flops / (ms * 1e-3) / 1e12
        mem = torch.cuda.max_memory_allocated() / 2 ** 30
        rows.append((name, n, mx, ms, T / (ms * 1e-3), tf, 100 * tf / peak, mem))
        print(f"{name:8s} seqs {n:3d} (padded to {mx}): {ms:9.2f} ms  {T / (ms * 1e-3):9.0f} tokens/s  "
              f"{tf:6.1f} TFLOP/s  MFU {100 * tf / peak:5.1f}%  peak mem {mem:.1f} GiB", flush=True)
    print("HF sdpa summary: " + "; ".join(f"{r[0]} {r[4]:.0f} tok/s MFU {r[6]:.1f}%" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
