#!/usr/bin/env python3
"""HF transformers + PEFT baseline for `make bench` (the protocol in BENCHMARKS.md).

Same model folder and the same shards as ctune; LoRA r16 on all linear layers,
bf16 base, fp32 LoRA, torch AdamW. Each optimizer step takes --tokens-per-step
tokens of documents (in shard order, truncated to --max-len):

  --mode packed   one row per step, documents concatenated, position_ids restart
                  per document, no attention mask (what TRL's padding_free does;
                  with sdpa this LEAKS across documents, see BENCHMARKS.md, "The setup")
  --mode padded   documents padded to the longest in a micro-batch of --batch rows

Reports the median step time over the steps after --warmup, tokens/s and the
peak allocated VRAM (torch.cuda.max_memory_allocated) as one JSON line.

    python3 scripts/hf_bench.py --model models/qwen3-0.6b --shards data/bench-qwen3/train.shard \
        --tokens-per-step 16384 --steps 25 --warmup 5 --mode packed [--checkpointing]
"""
import argparse
import json
import statistics
import struct
import sys
import time

import torch


def read_shard(path):
    """Documents of a ctune shard (docs/SHARDS.md) as (tokens, mask) lists."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"CTSHARD\0":
        sys.exit(f"{path}: not a ctune shard")
    n_docs, n_tok = struct.unpack_from("<QQ", data, 16)
    off = 64
    offsets = struct.unpack_from(f"<{n_docs + 1}Q", data, off)
    off += 8 * (n_docs + 1)
    tokens = memoryview(data)[off:off + 4 * n_tok].cast("I")
    off += 4 * n_tok
    mask = data[off:off + n_tok]
    return [(tokens[offsets[i]:offsets[i + 1]].tolist(), mask[offsets[i]:offsets[i + 1]]) for i in range(n_docs)]


def step_docs(docs, tokens_per_step, max_len):
    """Yields lists of documents of at most tokens_per_step tokens, forever."""
    i, cur, n = 0, [], 0
    while True:
        toks, mask = docs[i % len(docs)]
        toks, mask = toks[:max_len], mask[:max_len]
        i += 1
        if n + len(toks) > tokens_per_step and cur:
            yield cur
            cur, n = [], 0
        cur.append((toks, mask))
        n += len(toks)


def labels_of(toks, mask):
    return [t if m else -100 for t, m in zip(toks, mask)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--shards", nargs="+", required=True)
    ap.add_argument("--tokens-per-step", type=int, default=16384)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--mode", choices=["packed", "padded"], default="packed")
    ap.add_argument("--batch", type=int, default=4, help="rows per micro-batch in padded mode")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapter", help="train this PEFT adapter (e.g. the initial_adapter ctune wrote under "
                    "CTUNE_TRACE) instead of a fresh all-linear LoRA: the same modules as ctune, experts included")
    a = ap.parse_args()

    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    docs = [d for s in a.shards for d in read_shard(s)]
    try:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation=a.attn)
    except ValueError as e:  # e.g. gpt_oss (attention sinks) has no sdpa path in transformers 5.17
        print(f"note: attn_implementation={a.attn} refused ({str(e)[:80]}...); using eager", file=sys.stderr)
        a.attn = "eager"
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation=a.attn)
    model = model.cuda()
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if a.adapter:
        model = PeftModel.from_pretrained(model, a.adapter, is_trainable=True, autocast_adapter_dtype=True)
    else:
        cfg = LoraConfig(r=a.rank, lora_alpha=2 * a.rank, target_modules="all-linear", lora_dropout=0.0,
                         task_type="CAUSAL_LM")
        model = get_peft_model(model, cfg, autocast_adapter_dtype=True)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4)
    times, tokens = [], []
    gen = step_docs(docs, a.tokens_per_step, a.max_len)
    torch.cuda.reset_peak_memory_stats()
    for step in range(a.steps):
        batch = next(gen)
        ntok = sum(len(t) for t, _ in batch)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if a.mode == "packed":
            ids = torch.tensor([[t for d, _ in batch for t in d]], device="cuda")
            pos = torch.tensor([[i for d, _ in batch for i in range(len(d))]], device="cuda")
            lab = [x for d, m in batch for x in ([-100] + labels_of(d, m)[1:])]
            lab = torch.tensor([lab], device="cuda")
            n_items = int((lab != -100).sum())
            out = model(input_ids=ids, position_ids=pos, labels=lab, num_items_in_batch=n_items)
            out.loss.backward()
        else:
            n_items = sum(sum(m[1:]) for _, m in batch)
            for j in range(0, len(batch), a.batch):
                rows = batch[j:j + a.batch]
                L = max(len(d) for d, _ in rows)
                ids = torch.tensor([d + [0] * (L - len(d)) for d, _ in rows], device="cuda")
                att = torch.tensor([[1] * len(d) + [0] * (L - len(d)) for d, _ in rows], device="cuda")
                lab = torch.tensor([labels_of(d, m) + [-100] * (L - len(d)) for d, m in rows], device="cuda")
                out = model(input_ids=ids, attention_mask=att, labels=lab, num_items_in_batch=n_items)
                out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
            tokens.append(ntok)
    med = statistics.median(times)
    tok_s = statistics.median([n / t for n, t in zip(tokens, times)])
    print(json.dumps({"system": f"hf+peft {a.mode} {a.attn}" + (" ckpt" if a.checkpointing else ""),
                      "median_step_s": round(med, 4), "tokens_per_s": round(tok_s, 1),
                      "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                      "steps_timed": len(times), "mean_tokens_per_step": round(statistics.mean(tokens))}))


if __name__ == "__main__":
    main()
