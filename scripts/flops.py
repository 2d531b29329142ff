#!/usr/bin/env python3
"""FLOPs per trained token under BENCHMARKS.md's MFU accounting, for a model config and
the documents of the shards it trains on:

  N    matmul parameters a token passes through (active experts only, LM head
       included, embedding lookup excluded)
  A_f  attention-core forward FLOPs per token: 2 * S_doc * n_heads * head_dim per
       layer, averaged over tokens (so sum(S^2) / sum(S) over documents, each
       truncated to max_len)
  per token: 4N + 3.5 A_f + LoRA (6 r (d_in + d_out) per adapted matrix)

    python3 scripts/flops.py configs/models/qwen3-0.6b/config.json SHARD... [--rank 16] [--max-len 4096]
prints GFLOP/token; MFU = GFLOP/token * tokens/s / 790e3.
"""
import argparse
import json
import struct


def shard_lengths(path):
    with open(path, "rb") as f:
        head = f.read(64)
        n_docs = struct.unpack_from("<Q", head, 16)[0]
        offs = struct.unpack(f"<{n_docs + 1}Q", f.read(8 * (n_docs + 1)))
    return [offs[i + 1] - offs[i] for i in range(n_docs)]


def gflop_per_token(cfg, lengths, rank, max_len):
    H, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    nq = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nq)
    D = cfg.get("head_dim") or H // nq
    E = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    K = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0
    I = cfg.get("moe_intermediate_size", cfg["intermediate_size"]) if E else cfg["intermediate_size"]
    attn = H * (nq * D) * 2 + H * (nkv * D) * 2
    mlp = 3 * H * I * (K if E else 1) + (H * E if E else 0)
    N = L * (attn + mlp) + V * H
    mods = [(H, nq * D), (H, nkv * D), (H, nkv * D), (nq * D, H)]
    if not E:
        mods += [(H, I), (H, I), (I, H)]
    lora = L * sum(6 * rank * (a + b) for a, b in mods)
    lens = [min(n, max_len) for n in lengths]
    mean_s = sum(n * n for n in lens) / sum(lens)
    a_f = L * 2 * mean_s * nq * D
    return (4 * N + 3.5 * a_f + lora) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("shards", nargs="+")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=4096)
    a = ap.parse_args()
    lengths = [n for s in a.shards for n in shard_lengths(s)]
    print(f"{gflop_per_token(json.load(open(a.config)), lengths, a.rank, a.max_len):.4f}")


if __name__ == "__main__":
    main()
