#!/usr/bin/env python3
"""hf_merge_check.py - HF transformers + PEFT judge `ctune merge`.

    python3 scripts/hf_merge_check.py --model BASE_DIR --adapter ADAPTER_DIR \
        --merged MERGED_DIR [--device cpu|cuda] [--tol 1e-3]

Loads BASE + ADAPTER with PEFT (PeftModel.from_pretrained), merges it with
PEFT's merge_and_unload in fp32 and rounds every weight to bf16 once: that is
what `ctune merge` promises (bf16(W + delta), one rounding), so it is the
reference. MERGED loads as a plain HF model. Both run in fp32 with eager
attention over a few fixed token sequences (batch 1, positions 0..T-1).
Prints the normwise relative difference of the logits, ||merged - ref|| /
||ref||, next to the adapter's own effect (PEFT's base + adapter against the
base) and the unrounded PEFT model's distance from the reference (what bf16
rounding alone moves: random-weight tiny MoE models are sensitive, 8e-2 seen).
Passes (exit 0) when the difference is below --tol and below a tenth of the
adapter's effect (so an adapter that changes nothing cannot pass); else exit
1; malformed input exit 2. BASE and MERGED must load with no tensor missing,
unexpected or of another shape (from_pretrained's loading info), else exit 1
naming them. Needs torch, transformers and peft (no network).
"""
import argparse
import os
import sys


def die(path, msg):
    print(f"hf_merge_check: {path}: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path, dtype):
    """The model at path; exit 1 unless every tensor of it loads and none is left out."""
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager",
                                                       output_loading_info=True)
    bad = {k: info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)}
    if bad:
        print(f"hf_merge_check: {path}: HF does not load it cleanly: {bad}")
        sys.exit(1)
    return model


def logits_of(model, seqs, device):
    import torch
    out = []
    with torch.no_grad():
        for ids in seqs:
            x = torch.tensor([ids], dtype=torch.long, device=device)
            out.append(model(input_ids=x).logits.float().cpu().reshape(-1))
    return torch.cat(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--merged", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()
    for d in (args.model, args.adapter, args.merged):
        if not os.path.isdir(d):
            die(d, "not a directory")
    import torch
    from peft import PeftModel
    torch.set_float32_matmul_precision("highest")
    base = load(args.model, torch.float32)
    vocab = base.config.vocab_size
    # Fixed sequences: a short one and one past gpt_oss-style sliding windows.
    seqs = [[(7 * i + 3) % vocab for i in range(12)], [(31 * i + 11) % vocab for i in range(150)]]
    base.to(args.device).eval()
    base_logits = logits_of(base, seqs, args.device)
    peft = PeftModel.from_pretrained(base, args.adapter, autocast_adapter_dtype=True)
    peft.to(args.device).eval()
    peft_logits = logits_of(peft, seqs, args.device)
    ref = peft.merge_and_unload()
    with torch.no_grad():
        for p in ref.parameters():
            p.data = p.data.to(torch.bfloat16).float()
    ref_logits = logits_of(ref, seqs, args.device)
    del peft, ref, base
    merged = load(args.merged, torch.float32)
    merged.to(args.device).eval()
    merged_logits = logits_of(merged, seqs, args.device)
    scale = ref_logits.norm().item()
    diff = (merged_logits - ref_logits).norm().item() / scale
    effect = (base_logits - peft_logits).norm().item() / peft_logits.norm().item()
    rounding = (peft_logits - ref_logits).norm().item() / scale
    ok = diff < args.tol and diff < 0.1 * effect and diff == diff
    print(f"{os.path.basename(os.path.normpath(args.model))}: merged vs PEFT's merge in bf16 {diff:.2e} "
          f"(adapter effect {effect:.2e}, bf16 rounding alone {rounding:.2e}) -> {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
