#!/usr/bin/env python3
"""Long-sequence training data for the throughput runs at the reference shapes
(issue 6: 8 x 4096 target tokens per batch, 512 anchors per sequence, block 16).

GSM8K samples are ~200 tokens, so a 32,768-token micro-batch of them packs ~150
sequences and the drafter samples far fewer than 8 x 512 anchors: not the
reference work. This writes OpenAI-format chat records whose assistant turn is
K consecutive GSM8K answers joined by blank lines (~K x 100 tokens, > 4096 for
the default K), so `draftline run --max-len 4096 --token-budget 32768` packs
exactly 8 sequences of 4096 tokens per micro-batch, nearly all of them assistant
(loss-mask) tokens. Deterministic: record i uses answers i*K .. i*K+K-1 (mod N).

usage: make_long_data.py GSM8K_TRAIN_JSONL OUT_JSONL [--records N] [--answers-per-record K]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gsm8k")
    ap.add_argument("out")
    ap.add_argument("--records", type=int, default=256)
    ap.add_argument("--answers-per-record", type=int, default=48)
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.gsm8k, encoding="utf-8") if l.strip()]
    n, k = len(rows), a.answers_per_record
    with open(a.out, "w", encoding="utf-8") as f:
        for i in range(a.records):
            idx = [(i * k + j) % n for j in range(k)]
            answer = "\n\n".join(rows[j]["answer"] for j in idx)
            rec = {"messages": [{"role": "user", "content": rows[idx[0]]["question"]},
                                {"role": "assistant", "content": answer}]}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
