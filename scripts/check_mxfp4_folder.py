"""check_mxfp4_folder.py — an MXFP4 gpt_oss folder written by ctune
(mxfp4_write_experts + mxfp4_write_config) loads in transformers, and the
expert weights transformers dequantizes equal ctune's mxfp4_dequantize bit for
bit.

    make CUDA=0 BUILD=build-cpu build-cpu/tests/test_mxfp4
    /work/venv-hf/bin/python scripts/check_mxfp4_folder.py [--test build-cpu/tests/test_mxfp4] [--dir DIR]

Steps: a tiny random gpt_oss (H 64, I 32, 4 experts, 2 layers; each expert's
weights scaled by its own power of two so the scales vary) saved in bf16 by
transformers to DIR/bf16; `test_mxfp4 --convert DIR/bf16 DIR/mxfp4
DIR/expected.safetensors` rewrites it as MXFP4 and writes what ctune decodes;
transformers loads DIR/mxfp4 with Mxfp4Config(dequantize=True) (its CPU path:
no triton kernels needed). Checks: each layer's gate_up_proj and down_proj (HF
[E, K, rows]) equal expected (ctune's (E, rows, K)) transposed, in bf16 bits;
every other parameter equals the bf16 model's; config.quantization_config is
mxfp4; a forward pass is finite (its distance from the bf16 model, which
MXFP4 rounding explains, is printed). Exit 0 when all hold, 1 otherwise.
DIR defaults to a fresh temporary folder, removed at the end.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import GptOssConfig, GptOssForCausalLM, Mxfp4Config


def tiny_model():
    torch.manual_seed(26)
    cfg = GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=8, max_position_embeddings=256,
                       initializer_range=0.1, layer_types=["sliding_attention", "full_attention"],
                       rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                                        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                        "original_max_position_embeddings": 32})
    model = GptOssForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            ex = layer.mlp.experts
            for p in (ex.gate_up_proj, ex.down_proj):
                p.normal_(0, 0.1)
                p.mul_(torch.tensor([2.0 ** k for k in (-9, -1, 0, 5)], dtype=p.dtype).view(-1, 1, 1))
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--test", default="build-cpu/tests/test_mxfp4")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="ctune_mxfp4_folder_")
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    try:
        ref = tiny_model()
        src, dst, expected_path = (os.path.join(root, "bf16"), os.path.join(root, "mxfp4"),
                                   os.path.join(root, "expected.safetensors"))
        ref.save_pretrained(src)
        subprocess.run([args.test, "--convert", src, dst, expected_path], check=True)
        expected = load_file(expected_path)

        got = GptOssForCausalLM.from_pretrained(dst, quantization_config=Mxfp4Config(dequantize=True),
                                                dtype=torch.bfloat16).eval()
        # a dequantized model drops quantization_config; the folder's config keeps it
        qc = GptOssConfig.from_pretrained(dst).quantization_config
        check(qc.get("quant_method") == "mxfp4" and "lm_head" in (qc.get("modules_to_not_convert") or []),
              f"config.quantization_config is mxfp4: {qc}")

        experts = set()
        for l, layer in enumerate(got.model.layers):
            for proj in ("gate_up_proj", "down_proj"):
                name = f"model.layers.{l}.mlp.experts.{proj}"
                experts.add(name)
                hf = getattr(layer.mlp.experts, proj).detach()
                ours = expected[name].transpose(1, 2).contiguous()
                same_shape = tuple(hf.shape) == tuple(ours.shape)
                exact = same_shape and torch.equal(hf.to(torch.bfloat16).view(torch.int16),
                                                   ours.to(torch.bfloat16).view(torch.int16))
                exact = exact and torch.equal(ours.to(torch.bfloat16).float(), ours)  # ctune's fp32 is bf16-exact
                check(exact, f"{name}: transformers' dequantized {list(hf.shape)} equals mxfp4_dequantize bit for bit")
                orig = getattr(ref.model.layers[l].mlp.experts, proj).detach().float()
                rel = float((hf.float() - orig).norm() / orig.norm())
                check(rel < 0.2, f"{name}: MXFP4 rounding error vs the bf16 weights {rel:.3f} (< 0.2: every value lands where it came from)")

        ref_params = dict(ref.named_parameters())
        others = [(n, p) for n, p in got.named_parameters() if n not in experts]
        same = [n for n, p in others if torch.equal(p.detach(), ref_params[n].detach())]
        check(len(same) == len(others), f"{len(same)} of {len(others)} other parameters equal the bf16 model's")

        ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            a, b = got(ids).logits.float(), ref(ids).logits.float()
        check(bool(torch.isfinite(a).all()), "forward pass of the MXFP4 folder is finite")
        print(f"     logits vs the bf16 model: max |diff| {float((a - b).abs().max()):.4g}, "
              f"max |logit| {float(b.abs().max()):.4g}")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print("all checks passed" if not failures else f"{len(failures)} checks failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
