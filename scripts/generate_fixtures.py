#!/usr/bin/env python3
"""generate_fixtures.py - HF transformers + PEFT greedy generations for test_generate.c.

  /work/venv-hf/bin/python scripts/generate_fixtures.py [NAME...]

NAME is a fixture of tests/fixtures/parity_NAME/ (model/ and adapter/, made by
scripts/parity_fixtures.sh); default: qwen3_5 qwen3_5_moe, the Gated DeltaNet
hybrids. For each, a fixed prompt is decoded greedily for N_NEW tokens by
model.generate (HF's KV cache and, for GDN layers, its conv and recurrent
states) and, independently, by a full forward over the whole sequence per new
token (no cache); both in fp64 (hf_parity.py's --dtype float64, so the reference
is not fp32 rounding) and must agree. Writes tests/fixtures/generate_gdn/NAME.txt:

  prompt ID ID ...
  greedy ID ID ...
  margin X      (the smallest gap between the best and second-best logit)

ctune decodes in fp32; a margin well above fp32's ~1e-5 logit error means the
argmax cannot flip on rounding. Needs torch, transformers, peft (checked with
torch 2.11, transformers 5.17, peft 0.21).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_parity  # noqa: E402

PROMPT = [5, 17, 3, 60, 22, 9, 41, 0, 33, 12]
N_NEW = 16
OUT = "tests/fixtures/generate_gdn"


def greedy_no_cache(model, ids, n):
    import torch
    seq = list(ids)
    margin = float("inf")
    for _ in range(n):
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
        top = torch.topk(logits, 2).values
        margin = min(margin, float(top[0] - top[1]))
        seq.append(int(torch.argmax(logits)))
    return seq[len(ids):], margin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=["qwen3_5", "qwen3_5_moe"])
    a = ap.parse_args()
    import torch
    os.makedirs(OUT, exist_ok=True)
    for name in a.names:
        d = f"tests/fixtures/parity_{name}"
        args = argparse.Namespace(model=f"{d}/model", adapter=f"{d}/adapter", dtype="float64", device="cpu")
        model, _ = hf_parity.load_model(args)
        model.eval()
        with torch.no_grad():
            want, margin = greedy_no_cache(model, PROMPT, N_NEW)
            gen = model.generate(input_ids=torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT),
                                 dtype=torch.long), max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        got = gen[0, len(PROMPT):].tolist()
        if got != want:
            sys.exit(f"{name}: generate {got} differs from the uncached greedy loop {want}")
        with open(f"{OUT}/{name}.txt", "w") as f:
            f.write("prompt " + " ".join(map(str, PROMPT)) + "\n")
            f.write("greedy " + " ".join(map(str, want)) + "\n")
            f.write(f"margin {margin:.6g}\n")
        print(f"{name}: {want} (smallest margin {margin:.3g})")


if __name__ == "__main__":
    main()
