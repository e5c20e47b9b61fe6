#!/usr/bin/env python3
"""CPU check of the PyTorch comparison's code (issue 14), run by hand (not in make test):

  /work/venv/bin/python bench/check_pytorch_dflash.py [--draftline bin/draftline]

1. bench/dflash_torch.py's batched drafter (one flex_attention call with a BlockMask
   over all blocks, chunked loss) against the independent per-block fp32 reference of
   tests/fixtures/drafter/make_fixture.py, through the fixture it wrote (fixture.json:
   weights, batch, anchors, loss sum, weight sum, gradients): same loss to 1e-5
   (relative), every gradient to 1e-4 (relative to its norm), fp32.
2. bench/dlc_batches.py's micro-batches and anchors against `draftline run --device cpu`
   on the same cache and flags (the step records' tokens and the drafter's block
   count), when --draftline names a binary: a tiny 4-layer Qwen3 made here with
   transformers, gpucarry/sf.dlc (or --data).
3. bench/pytorch_dflash.py end to end on that tiny model (--device cpu --tiny): the
   JSON line parses and its loss is finite.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import dflash_torch as dt  # noqa: E402
import dlc_batches as db  # noqa: E402


def t(x, dtype=torch.float32):
    return torch.tensor(x["data"], dtype=dtype).reshape(x["shape"])


def check_fixture():
    fx = json.load(open(os.path.join(ROOT, "tests/fixtures/drafter/fixture.json")))
    cfg = json.load(open(os.path.join(ROOT, "tests/fixtures/drafter/config.json")))
    D, H, Hkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    B, n_feat = cfg["block_size"], len(cfg["dflash_config"]["target_layer_ids"])
    dr = dt.Drafter(D, H, Hkv, hd, cfg["intermediate_size"], cfg["num_hidden_layers"], n_feat,
                    cfg["rms_norm_eps"], cfg["rope_theta"])
    dr.load_public({n: t(v) for n, v in fx["params"].items()})
    ids = t(fx["ids"], torch.int64).numpy().astype(np.int32)
    mask = t(fx["loss_mask"], torch.int64).numpy().astype(np.uint8)
    cu = t(fx["cu_seqlens"], torch.int64).numpy().astype(np.int32)
    anchors = t(fx["anchors"], torch.int64).numpy()
    batch = dt.make_batch(ids, mask, cu, anchors, B, fx["gamma"], cfg["dflash_config"]["mask_token_id"], "cpu")
    args = (dr, batch, t(fx["features"]), t(fx["embed"]), t(fx["lm_head"]))
    with torch.no_grad():  # FlexAttention's forward on the BlockMask (no CPU backward)
        _, s_flex = dt.drafter_loss(*args, dt.flex_attention, chunk_rows=8)
    loss, s = dt.drafter_loss(*args, dt.dense_attention, chunk_rows=8)
    loss.backward()
    ok = True
    frel = abs(float(s_flex) - fx["loss_sum"]) / abs(fx["loss_sum"])
    print(f"fixture: flex_attention forward loss_sum {float(s_flex):.7f} (rel {frel:.2e})")
    ok &= frel < 1e-5
    s = s.detach()
    rel = abs(float(s) - fx["loss_sum"]) / abs(fx["loss_sum"])
    wrel = abs(batch["weight_sum"] - fx["weight_sum"]) / fx["weight_sum"]
    print(f"fixture: loss_sum {float(s):.7f} vs {fx['loss_sum']:.7f} (rel {rel:.2e}), "
          f"weight_sum rel {wrel:.2e}")
    ok &= rel < 1e-5 and wrel < 1e-6
    worst, wname = 0.0, ""
    for n, g in fx["grads"].items():
        ref, got = t(g), dr.public_grad(n)
        e = float((got - ref).norm() / max(float(ref.norm()), 1e-12))
        if e > worst:
            worst, wname = e, n
    print(f"fixture: worst gradient rel error {worst:.2e} ({wname})")
    ok &= worst < 1e-4
    return ok


def tiny_model(out):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                      rope_theta=1e6, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)


def check_batches(draftline, data, model, work):
    """draftline's step records (target tokens per step) and drafter blocks vs the Python port."""
    run = os.path.join(work, "run")
    flags = ["--token-budget", "2048", "--max-len", "1024", "--block-size", "16", "--num-anchors", "24",
             "--drafter-layers", "2", "--max-steps", "4", "--micro-batches-per-step", "1", "--seed", "3"]
    r = subprocess.run([draftline, "run", "--device", "cpu", "--target-model", model, "--data", data,
                        "--out", run, "--threads", "1"] + flags, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print("draftline run failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
        return False
    steps = [json.loads(x) for x in open(os.path.join(run, "steps.jsonl")) if x.strip()]
    bt = db.Batcher(db.Dlc(data), 3, 2048, 1024)
    ok, prev = True, 0
    for st in steps:
        ids, mask, cu = bt.get(st["step"])
        got = st["tokens"] - prev
        prev = st["tokens"]
        nb = len(db.sample_anchors(cu, mask, 16, 24, 3, st["step"]))
        print(f"step {st['step']}: draftline {got} tokens, port {len(ids)} tokens, {len(cu) - 1} seqs, "
              f"{nb} blocks")
        ok &= got == len(ids)
    log = open(os.path.join(run, "logs", "drafter0.log")).read()
    print("drafter0:", [ln[ln.find("stopped"):] for ln in log.splitlines() if "stopped:" in ln][:1])
    return ok


def check_end_to_end(data, model):
    r = subprocess.run([sys.executable, os.path.join(HERE, "pytorch_dflash.py"), "--device", "cpu", "--tiny",
                        "--target-model", model, "--data", data, "--steps", "3", "--warmup", "1"],
                       capture_output=True, text=True, timeout=900)
    print(r.stderr[-1500:])
    last = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not last:
        print("pytorch_dflash.py failed:", r.stdout[-2000:])
        return False
    rep = json.loads(last[-1])
    print("pytorch_dflash.py:", last[-1])
    return bool(np.isfinite(rep["loss_last"])) and rep["steps"] == 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draftline", default="")
    ap.add_argument("--data", default=os.path.join(ROOT, "gpucarry/sf.dlc"))
    a = ap.parse_args()
    ok = check_fixture()
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, "tiny6")
        tiny_model(model)
        if a.draftline:
            ok &= check_batches(a.draftline, a.data, model, work)
        ok &= check_end_to_end(a.data, model)
    print("CHECK", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
