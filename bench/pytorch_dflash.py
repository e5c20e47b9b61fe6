#!/usr/bin/env python3
"""The PyTorch DFlash training loop a user would write (issue 14's comparison).

Target: Hugging Face AutoModelForCausalLM.from_pretrained(DIR, bf16, sdpa) on the device,
its base model called with output_hidden_states=True under no_grad on a right-PADDED
batch of the micro-batch's sequences (attention mask; HF style: a user pads, draftline
packs), the features = hidden_states[i + 1] for DFlash's layer ids (36 layers, 5
features: 1, 9, 17, 25, 33) concatenated, gathered back to the real tokens.
Drafter: bench/dflash_torch.py (5 Qwen3 layers at the target's shapes, fc + hidden_norm
context, block of B = anchor + B-1 mask tokens, the target's embedding and LM head
frozen, loss weights exp(-(k-1)/gamma), gamma 7 for B 16, loss-masked), attention by
torch.compile(flex_attention) with a BlockMask, fp32 master weights under bf16
autocast, AdamW(fused=True), cosine LR from --lr, gradient clip 1.0 (draftline's
defaults). The micro-batches and anchors are draftline's own (bench/dlc_batches.py:
the same .dlc, seed and flags give the same token ids, sequences and anchors).

Per step: target forward time, drafter step time (forward, loss, backward, clip,
AdamW), target tokens (real tokens of the batch), sequences, blocks. At the end one
JSON line on stdout: steady state over steps >= --warmup (tokens / the summed step
times: the same definition as draftline's steps.jsonl window), the whole process's
wall clock (imports, model load, compile, every step), peak device memory.

usage: pytorch_dflash.py --target-model DIR --data FILE.dlc [--steps 40] [--token-budget 32768
         --max-len 4096 --num-anchors 512 --block-size 16 --drafter-layers 5]
       pytorch_dflash.py --device cpu --tiny ...   (CPU check at tiny shapes)
       pytorch_dflash.py --data FILE.dlc --plan-only ...   (micro-batches per epoch, no torch)
"""
import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlc_batches as db  # noqa: E402

MASK_TOKEN_QWEN3 = 151669


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-model", default="")
    ap.add_argument("--data", required=True, help="prepared cache (.dlc, `draftline prepare`)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes for a CPU check (budget 2048, "
                    "max-len 1024, 16 anchors, 2 drafter layers, fp32, dense attention)")
    ap.add_argument("--token-budget", type=int, default=32768)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--num-anchors", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--drafter-layers", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the steady state")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--loss-chunk-rows", type=int, default=4096)
    ap.add_argument("--attention", default="", help="flex-compiled (default on cuda) | flex | dense")
    ap.add_argument("--compile-layers", action="store_true", help="torch.compile each drafter layer too")
    ap.add_argument("--checkpoint-layers", action="store_true", help="activation checkpointing per layer")
    ap.add_argument("--label", default="")
    ap.add_argument("--plan-only", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        a.token_budget, a.max_len, a.num_anchors, a.drafter_layers = 2048, 1024, 16, 2
    if not a.attention:
        a.attention = "flex-compiled" if a.device.startswith("cuda") else "dense"
    return a


def plan(a):
    """Host micro-batches for steps 0..steps-1 (one per step) + epochs needed."""
    dlc = db.Dlc(a.data)
    per_epoch = len(db.Batcher(dlc, a.seed, a.token_budget, a.max_len).plan(0))
    epochs = max(1, math.ceil(a.steps / per_epoch))
    bt = db.Batcher(dlc, a.seed, a.token_budget, a.max_len, epochs)
    mbs = []
    for mb in range(a.steps):
        ids, mask, cu = bt.get(mb)
        anchors = db.sample_anchors(cu, mask, a.block_size, a.num_anchors, a.seed, mb)
        mbs.append((ids, mask, cu, anchors))
    return per_epoch, epochs, mbs


def load_target(a, torch):
    from transformers import AutoModelForCausalLM
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    try:  # straight onto the device when accelerate is installed, else load on the host and move
        import accelerate  # noqa: F401
        kw, how = {"device_map": a.device}, "device_map"
    except ImportError:
        kw, how = {}, "host then .to(device) (no accelerate)"
    m = AutoModelForCausalLM.from_pretrained(a.target_model, dtype=dtype, attn_implementation="sdpa", **kw)
    if not kw:
        m.to(a.device)
    m.eval().requires_grad_(False)
    return m, how


def target_features(model, ids, cu, layer_ids, device, torch):
    """Padded HF forward -> (T, n_feat * D) features of the real tokens, packed."""
    lens = [int(cu[i + 1] - cu[i]) for i in range(len(cu) - 1)]
    L = max(lens)
    inp = torch.zeros(len(lens), L, dtype=torch.long)
    att = torch.zeros(len(lens), L, dtype=torch.long)
    for i, n in enumerate(lens):
        inp[i, :n] = torch.from_numpy(ids[cu[i]:cu[i] + n].astype("int64"))
        att[i, :n] = 1
    inp, att = inp.to(device), att.to(device)
    with torch.no_grad():
        hs = model.model(input_ids=inp, attention_mask=att, output_hidden_states=True, use_cache=False).hidden_states
        feats = torch.cat([hs[i + 1] for i in layer_ids], -1)[att.bool()]
    return feats, len(lens) * L


def build_drafter(a, cfg, n_feat, device, torch, dt):
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    with torch.device(device):  # built and initialised on the device
        dr = dt.Drafter(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, hd,
                        cfg.intermediate_size, a.drafter_layers, n_feat, cfg.rms_norm_eps,
                        getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"])
    dr.init_random(seed=a.seed)
    if a.compile_layers:
        for layer in dr.layers:
            layer.compile()
    if a.checkpoint_layers:
        from torch.utils.checkpoint import checkpoint
        for layer in dr.layers:
            fwd = layer.forward
            layer.forward = (lambda f: lambda *x: checkpoint(f, *x, use_reentrant=False))(fwd)
    opt = torch.optim.AdamW(dr.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0,
                            fused=device.startswith("cuda"))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / max(a.steps, 1))))
    return dr, opt, sched, hd


def run_steps(a, mbs, model, dr, opt, sched, torch, dt, ctx):
    """The training loop; returns per-step records."""
    dev, recs = a.device, []
    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    attn = dt.attention_fn(a.attention)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.startswith("cuda") else torch.autocast(
        "cpu", enabled=False)
    for step, (ids, mask, cu, anchors) in enumerate(mbs):
        t0 = time.time()
        batch = dt.make_batch(ids, mask, cu, anchors, a.block_size, ctx["gamma"], ctx["mask_token"], dev)
        feats, padded = target_features(model, ids, cu, ctx["layer_ids"], dev, torch)
        sync()
        t1 = time.time()
        with amp:
            loss, _ = dt.drafter_loss(dr, batch, feats, embed, head, attn, a.loss_chunk_rows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dr.parameters(), a.clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        lv = float(loss.detach())
        sync()
        t2 = time.time()
        r = {"step": step, "tokens": int(len(ids)), "seqs": int(len(cu) - 1), "blocks": int(len(anchors)),
             "padded_tokens": padded, "target_s": t1 - t0, "drafter_s": t2 - t1, "step_s": t2 - t0,
             "loss": lv, "t_end": t2 - T_START, "sum_ctx": batch["sum_ctx"]}
        recs.append(r)
        print(f"step {step}: {r['tokens']} tokens, {r['seqs']} seqs ({padded} padded), {r['blocks']} blocks, "
              f"target {r['target_s']:.3f} s, drafter {r['drafter_s']:.3f} s, loss {lv:.4f}",
              file=sys.stderr, flush=True)
        del feats, batch, loss
    return recs


def report(a, recs, per_epoch, epochs, times, cfg, hd, n_feat, torch):
    st = [r for r in recs if r["step"] >= a.warmup] or recs
    secs = sum(r["step_s"] for r in st)
    med = statistics.median
    fl = [_flops(cfg, hd, a, n_feat, r) / r["drafter_s"] for r in st]
    rep = {
        "side": "pytorch", "label": a.label, "device": a.device, "steps": len(recs), "warmup": a.warmup,
        "token_budget": a.token_budget, "max_len": a.max_len, "num_anchors": a.num_anchors,
        "block_size": a.block_size, "drafter_layers": a.drafter_layers, "attention": a.attention,
        "compile_layers": a.compile_layers, "checkpoint_layers": a.checkpoint_layers,
        "data": os.path.basename(a.data), "micro_batches_per_epoch": per_epoch, "epochs": epochs,
        "tokens_total": sum(r["tokens"] for r in recs),
        "tokens_per_step_mean": statistics.mean(r["tokens"] for r in recs),
        "seqs_per_step_mean": statistics.mean(r["seqs"] for r in recs),
        "blocks_per_step_mean": statistics.mean(r["blocks"] for r in recs),
        "anchors_per_seq_mean": sum(r["blocks"] for r in recs) / sum(r["seqs"] for r in recs),
        "padding_share": 1 - sum(r["tokens"] for r in recs) / sum(r["padded_tokens"] for r in recs),
        "steady_tokens_per_s": sum(r["tokens"] for r in st) / secs,
        "steady_samples_per_s": sum(r["seqs"] for r in st) / secs,
        "median_step_s": med(r["step_s"] for r in st), "median_target_s": med(r["target_s"] for r in st),
        "median_drafter_s": med(r["drafter_s"] for r in st),
        "drafter_tflops_median": med(fl) / 1e12,
        "first_step_s": recs[0]["step_s"], "loss_first": recs[0]["loss"], "loss_last": recs[-1]["loss"],
        "wall_s": time.time() - T_START, **times,
        "torch": torch.__version__,
    }
    rep["wall_tokens_per_s"] = rep["tokens_total"] / rep["wall_s"]
    if a.device.startswith("cuda"):
        rep["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rep["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return rep


def _flops(cfg, hd, a, n_feat, r):
    import dflash_torch as dt
    return dt.step_flops(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, hd,
                         cfg.intermediate_size, cfg.vocab_size, a.drafter_layers, n_feat, r["tokens"],
                         r["blocks"], a.block_size, r["sum_ctx"])


def main():
    a = parse()
    t = time.time()
    per_epoch, epochs, mbs = plan(a)
    times = {"plan_s": time.time() - t}
    if a.plan_only:
        print(json.dumps({"micro_batches_per_epoch": per_epoch, "epochs": epochs, "steps": a.steps,
                          "tokens": [len(m[0]) for m in mbs], "seqs": [len(m[2]) - 1 for m in mbs],
                          "blocks": [len(m[3]) for m in mbs]}))
        return 0
    import torch
    import dflash_torch as dt
    t = time.time()
    model, how = load_target(a, torch)
    cfg = model.config
    times["target_load_s"] = time.time() - t
    times["target_load_how"] = how
    n_feat = a.drafter_layers
    ctx = {"layer_ids": dt.default_layer_ids(cfg.num_hidden_layers, n_feat),
           "gamma": dt.default_gamma(a.block_size),
           "mask_token": MASK_TOKEN_QWEN3 if cfg.vocab_size > MASK_TOKEN_QWEN3 else 16}
    t = time.time()
    dr, opt, sched, hd = build_drafter(a, cfg, n_feat, a.device, torch, dt)
    times["drafter_init_s"] = time.time() - t
    print(f"pytorch_dflash: target {cfg.num_hidden_layers} layers D {cfg.hidden_size} loaded in "
          f"{times['target_load_s']:.1f} s; features from layers {ctx['layer_ids']}; drafter "
          f"{sum(p.numel() for p in dr.parameters()):,} parameters; gamma {ctx['gamma']:g}; "
          f"{per_epoch} micro-batches per epoch, {epochs} epoch(s)", file=sys.stderr, flush=True)
    recs = run_steps(a, mbs, model, dr, opt, sched, torch, dt, ctx)
    rep = report(a, recs, per_epoch, epochs, times, cfg, hd, n_feat, torch)
    print(json.dumps(rep), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
