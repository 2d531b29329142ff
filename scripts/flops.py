#!/usr/bin/env python3
"""FLOPs per trained token under BENCHMARKS.md's MFU accounting, for a model config and
the documents of the shards it trains on:

  N    matmul parameters a token passes through (active experts only, LM head
       included, embedding lookup excluded)
  A_f  attention-core forward FLOPs per token: 2 * S_doc * n_heads * head_dim per
       layer, averaged over tokens (so sum(S^2) / sum(S) over documents, each
       truncated to max_len)
  per token: 4N + 3.5 A_f + LoRA (6 r (d_in + d_out) per adapted matrix)

Gated DeltaNet hybrids (a config with layer_types, or a wrapper's text_config): a
linear-attention layer's N is its projections (in_proj_qkv, z, b, a, out_proj) and
its A_f the recurrence's 6 Dk Dv per token and value head (read S^T k, write k u^T,
output S^T q); a full-attention layer's q_proj is twice as wide (the output gate).
LoRA counts the modules of the GDN benchmark: q, k, v, o, the MLP, in_proj_qkv,
in_proj_z and out_proj.

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
    cfg = cfg.get("text_config", cfg)
    H, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    nq = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nq)
    D = cfg.get("head_dim") or H // nq
    E = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    K = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0
    I = cfg.get("moe_intermediate_size", cfg.get("intermediate_size")) if E else cfg["intermediate_size"]
    Is = cfg.get("shared_expert_intermediate_size") or 0
    types = cfg.get("layer_types") or ["full_attention"] * L
    gated = "linear_num_value_heads" in cfg  # the hybrids' attention carries an output gate in q_proj
    lens = [min(n, max_len) for n in lengths]
    mean_s = sum(n * n for n in lens) / sum(lens)
    mlp = 3 * H * I * (K if E else 1) + (H * E if E else 0) + (3 * H * Is + H if Is else 0)
    mlp_mods = [] if E else [(H, I), (H, I), (I, H)]
    N, a_f, lora = V * H, 0.0, 0
    for t in types[:L]:
        if t == "linear_attention":
            Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
            Dk, Dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
            conv, Vd = 2 * Hk * Dk + Hv * Dv, Hv * Dv
            N += H * (conv + Vd + 2 * Hv) + Vd * H + mlp
            a_f += 6 * Dk * Dv * Hv
            mods = [(H, conv), (H, Vd), (Vd, H)] + mlp_mods
        else:
            qo = nq * D * (2 if gated else 1)
            N += H * qo + H * (nkv * D) * 2 + nq * D * H + mlp
            a_f += 2 * mean_s * nq * D
            mods = [(H, qo), (H, nkv * D), (H, nkv * D), (nq * D, H)] + mlp_mods
        lora += sum(6 * rank * (a + b) for a, b in mods)
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
