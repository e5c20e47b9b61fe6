#!/usr/bin/env python3
"""Hugging Face transformers baseline for bench/bench_target.c: the target forward of a
Qwen3-8B-shaped model (--config qwen3-8b, default) or a Qwen3-30B-A3B-shaped MoE
(--config qwen3-30b-a3b), random init from the same config directly on the GPU (no weights
needed), bf16, attn_implementation="sdpa", on the same GPU and the same batches, reporting
tokens/s and MFU with the same FLOP count, so draftline's speed can be reported as a ratio.

Batches (T = --tokens, default 65,536 tokens):
  Nx4096: input_ids (T/4096, 4096) (16 x 4096 at 65,536), no padding (sdpa's causal path).
  mixed:  --lengths (comma-separated; bench_target prints its mixed batch's lengths on a
          "mixed lengths:" line, so both run the very same batch), else lengths drawn
          uniform in 128..4096 by numpy with a fixed seed summing to T; right-padded to the
          longest and run as one batch with an attention mask: what HF does with variable
          lengths under sdpa (FLOPs and tokens/s count the real tokens only).
Forward: the base model (Qwen3Model / Qwen3MoeModel: all layers + final norm, no LM head)
with output_hidden_states=True (the hidden-state capture DFlash needs), under
torch.no_grad(). FLOPs = sum over layers of 2 * T * P_layer + 4 * hd * H * sum_s L_s (L_s + 1) / 2
as bench_target's "full" mode, P_layer the layer's matmul parameters a token goes through:
dense D*(H*hd + 2*Hkv*hd) + H*hd*D + 3*D*F; MoE the same attention + the router D*E + top-k
experts k*3*D*Fm (active parameters only). MFU against a bf16 8192^3 torch.matmul measured
in the same run (random data). Times: CUDA events, median of --reps forwards after one
warm-up.

MoE experts (--experts): transformers 5 dispatches Qwen3MoeExperts through
config._experts_implementation: "grouped_mm" (torch grouped GEMMs over the tokens sorted by
expert; the default when torch supports it) or "eager" (a Python loop over the experts hit,
one index + two linears + index_add_ each). Default: what the library picks (that is what a
user gets; printed); --experts eager,default runs both.

--layers N: the first N decoder layers only (as `draftline mkmodel --layers N`).
--describe: build the model on the meta device and print its parameters and the FLOPs of
the batches, no GPU needed (checks the arguments and the counts).
--json FILE: the figures as JSON.

Usage (on the GPU machine): python3 bench/hf_target.py [--config qwen3-8b|qwen3-30b-a3b]
    [--tokens 65536] [--reps 3] [--lengths a,b,...] [--layers N] [--experts LIST] [--json FILE]
"""
import argparse
import json
import statistics
import sys
import time

import torch

CONFIGS = ("qwen3-8b", "qwen3-30b-a3b")


def make_config(name, layers=0):
    """The transformers config of a preset (the shapes of draftline mkmodel's presets)."""
    if name == "qwen3-8b":
        from transformers import Qwen3Config
        cfg = Qwen3Config(
            vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
            tie_word_embeddings=False, attention_bias=False, torch_dtype="bfloat16")
    else:  # Qwen/Qwen3-30B-A3B config.json
        from transformers import Qwen3MoeConfig
        kw = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                  num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                  head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=False, num_experts=128,
                  num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                  decoder_sparse_step=1, mlp_only_layers=[], torch_dtype="bfloat16")
        try:
            cfg = Qwen3MoeConfig(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **kw)
        except TypeError:  # transformers without rope_parameters
            cfg = Qwen3MoeConfig(rope_theta=1e6, **kw)
    if layers:
        if layers > cfg.num_hidden_layers:
            raise SystemExit(f"hf_target: --layers {layers}: {name} has {cfg.num_hidden_layers}")
        cfg.num_hidden_layers = layers
    return cfg


def is_moe_layer(cfg, l):
    """transformers Qwen3MoeDecoderLayer's test."""
    E = getattr(cfg, "num_experts", 0) or 0
    step = getattr(cfg, "decoder_sparse_step", 1) or 1
    return E > 0 and l not in (getattr(cfg, "mlp_only_layers", None) or []) and (l + 1) % step == 0


def layer_params(cfg, l):
    """Matmul parameters one token goes through in layer l (active parameters for MoE)."""
    D, H, Hkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    p = D * (H * hd + 2 * Hkv * hd) + H * hd * D
    if is_moe_layer(cfg, l):
        return p + D * cfg.num_experts + cfg.num_experts_per_tok * 3 * D * cfg.moe_intermediate_size
    return p + 3 * D * cfg.intermediate_size


def forward_flops(cfg, T, lens):
    pairs = sum(n * (n + 1) / 2 for n in lens)
    attn = 4.0 * cfg.head_dim * cfg.num_attention_heads * pairs
    return sum(2.0 * T * layer_params(cfg, l) + attn for l in range(cfg.num_hidden_layers))


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


def batches(args):
    T = args.tokens
    out = [(f"{T // 4096}x4096", [4096] * (T // 4096))]
    if args.lengths:
        out.append(("mixed", [int(x) for x in args.lengths.split(",") if x]))
    else:
        out.append(("mixed", mixed_lengths(T)))
    for name, lens in out:
        if sum(lens) != T:
            raise SystemExit(f"hf_target: {name} lengths sum to {sum(lens)}, not {T}")
    return out


def model_class(cfg):
    from transformers import Qwen3Model, Qwen3MoeModel
    return Qwen3MoeModel if getattr(cfg, "num_experts", 0) else Qwen3Model


def describe(args, cfg):
    with torch.device("meta"):
        model = model_class(cfg)(cfg)
    n = sum(p.numel() for p in model.parameters())
    act = cfg.vocab_size * cfg.hidden_size + sum(layer_params(cfg, l) for l in range(cfg.num_hidden_layers))
    print(f"{args.config}: {cfg.num_hidden_layers} layers, {n / 1e9:.3f} B params (no LM head), "
          f"{act / 1e9:.3f} B active per token (embedding + matmuls)")
    for name, lens in batches(args):
        print(f"{name}: {len(lens)} seqs, {forward_flops(cfg, args.tokens, lens) / 1e12:.1f} TFLOP per forward")
    return 0


def build(cfg, experts):
    """Random init directly on the GPU, bf16; experts: None (library default) or a name."""
    cfg._attn_implementation = "sdpa"
    if experts and getattr(cfg, "num_experts", 0):
        cfg._experts_implementation = experts
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.time()
    with torch.device("cuda"):
        model = model_class(cfg)(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    torch.cuda.synchronize()
    return model, time.time() - t0


def run_one(args, cfg, model, peak, g, experts_name):
    rows = []
    T = args.tokens
    for name, lens in batches(args):
        n, mx = len(lens), max(lens)
        ids = torch.randint(0, cfg.vocab_size, (n, mx), device="cuda", generator=g)
        mask = None
        if name == "mixed":
            mask = torch.zeros(n, mx, dtype=torch.long, device="cuda")
            for i, ln in enumerate(lens):
                mask[i, :ln] = 1
        flops = forward_flops(cfg, T, lens)

        def fwd():
            with torch.no_grad():
                return model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                             use_cache=False)

        torch.cuda.reset_peak_memory_stats()
        ms = time_ms(fwd, args.reps)
        tf = flops / (ms * 1e-3) / 1e12
        mem = torch.cuda.max_memory_allocated() / 2 ** 30
        rows.append(dict(batch=name, experts=experts_name, seqs=n, padded_to=mx, ms=ms,
                         tokens_per_s=T / (ms * 1e-3), tflop=flops / 1e12, tflops=tf,
                         mfu=tf / peak, peak_mem_gib=mem))
        print(f"{name:8s} seqs {n:3d} (padded to {mx}) experts {experts_name}: {ms:9.2f} ms  "
              f"{T / (ms * 1e-3):9.0f} tokens/s  {tf:6.1f} TFLOP/s  MFU {100 * tf / peak:5.1f}%  "
              f"peak mem {mem:.1f} GiB", flush=True)
        del ids, mask
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=CONFIGS, default="qwen3-8b")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lengths", default="", help="mixed batch lengths, comma-separated")
    ap.add_argument("--layers", type=int, default=0, help="first N decoder layers only")
    ap.add_argument("--experts", default="default",
                    help="MoE experts implementations, comma-separated: default, eager, grouped_mm")
    ap.add_argument("--json", default="", help="write the figures to this file")
    ap.add_argument("--describe", action="store_true", help="counts only, on the meta device")
    args = ap.parse_args()
    if args.tokens < 4096 or args.tokens % 4096:
        raise SystemExit("hf_target: --tokens must be a positive multiple of 4096")
    cfg = make_config(args.config, args.layers)
    if args.describe:
        return describe(args, cfg)
    if not torch.cuda.is_available():
        print("SKIP: hf_target: no CUDA device")
        return 0
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name(0)}")
    peak = gemm_peak()
    report = dict(bench="hf_target", config=args.config, layers=cfg.num_hidden_layers,
                  tokens=args.tokens, torch=torch.__version__,
                  transformers=transformers.__version__, gemm_peak_tflops=peak, rows=[])
    g = torch.Generator(device="cuda").manual_seed(1)
    for ex in [x for x in args.experts.split(",") if x]:
        model, init_s = build(cfg, None if ex == "default" else ex)
        used = getattr(model.config, "_experts_implementation", None)
        print(f"model: {type(model).__name__}, attention {model.config._attn_implementation}, "
              f"experts {used if getattr(cfg, 'num_experts', 0) else '-'} (asked {ex}); "
              f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f} B params (no LM head); "
              f"random init on the GPU in {init_s:.1f} s", flush=True)
        report.setdefault("init_s", {})[ex] = init_s
        report.setdefault("experts_used", {})[ex] = used
        report["rows"] += run_one(args, cfg, model, peak, g, f"{ex}->{used}")
        del model
        torch.cuda.empty_cache()
    print("HF sdpa summary: " + "; ".join(
        f"{r['batch']} [{r['experts']}] {r['tokens_per_s']:.0f} tok/s MFU {100 * r['mfu']:.1f}%"
        for r in report["rows"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
