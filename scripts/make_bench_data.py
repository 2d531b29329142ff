#!/usr/bin/env python3
"""Token-id JSONL with a realistic long-tailed mix of sample lengths, for
benchmarks (the protocol in BENCHMARKS.md): log-normal lengths with median ~600 tokens,
clipped to [16, max_len]; random ids below --vocab; the first ~20% of every
sample is a prompt without loss (labels -100).

    python3 scripts/make_bench_data.py --vocab 151936 --tokens 2000000 --out bench.jsonl
    build/ctune prepare --in bench.jsonl --out DIR --vocab-size 151936
"""
import argparse
import json
import math
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--tokens", type=int, required=True, help="total tokens to write")
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--median", type=float, default=600.0)
    ap.add_argument("--sigma", type=float, default=0.9, help="log-normal shape: larger = longer tail")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    total = 0
    with open(a.out, "w") as f:
        while total < a.tokens:
            n = int(min(a.max_len, max(16, rng.lognormvariate(math.log(a.median), a.sigma))))
            ids = [rng.randrange(a.vocab) for _ in range(n)]
            prompt = max(1, n // 5)
            labels = [-100] * prompt + ids[prompt:]
            f.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
            total += n


if __name__ == "__main__":
    main()
