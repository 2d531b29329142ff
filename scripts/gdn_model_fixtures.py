"""gdn_model_fixtures.py — the tensors transformers expects on disk for the tiny
Gated DeltaNet hybrids, and a check that HF loads what `ctune init` writes.

    /work/venv-hf/bin/python scripts/gdn_model_fixtures.py [--ctune build-cpu/ctune]

For each NAME in MODELS (a folder configs/models/NAME), builds the model from
its config in transformers on the CPU (random weights, no download), saves it
with save_pretrained into a scratch folder and writes what the safetensors hold
to tests/fixtures/gdn_models/NAME.json: {"config", "class", "tensors": {name:
shape}}. save_pretrained writes the checkpoint layout (transformers v5 fuses the
experts into gate_up_proj / down_proj in memory and splits them again on save),
so these are the names a checkpoint on disk has. The wrappers' vision tower
(model.visual.*) is left out: ctune ignores it. tests/test_model_config.c checks
that model_tensor_specs gives exactly these names and shapes.

With --ctune, also runs `ctune init` on each config and loads the folder with
AutoModelForCausalLM.from_pretrained(dir, output_loading_info=True); it fails
unless nothing is missing, unexpected or mismatched. For the multimodal
wrappers (qwen3_5, qwen3_5_moe) AutoModelForCausalLM gives the text-only
Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM, which reads the
model.language_model. prefix and ignores model.visual.*; the script also loads
them with AutoModelForImageTextToText (the ForConditionalGeneration class) and
accepts only the vision tower as missing there.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["tiny-qwen3_5", "tiny-qwen3_5-text", "tiny-qwen3_5-moe", "tiny-qwen3-next"]
WRAPPERS = {"qwen3_5", "qwen3_5_moe"}


def model_class(config):
    return AutoModelForImageTextToText if config.model_type in WRAPPERS else AutoModelForCausalLM


def saved_tensors(folder):
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "pt") as st:
                for k in st.keys():
                    out[k] = list(st.get_slice(k).get_shape())
    return out


def write_fixture(name, out_dir, scratch):
    cfg_dir = os.path.join(ROOT, "configs", "models", name)
    config = AutoConfig.from_pretrained(cfg_dir)
    torch.manual_seed(0)
    model = model_class(config).from_config(config)
    save = os.path.join(scratch, name)
    model.save_pretrained(save)
    tensors = {k: v for k, v in sorted(saved_tensors(save).items()) if not k.startswith("model.visual.")}
    fixture = {"config": f"configs/models/{name}", "class": type(model).__name__,
               "transformers": transformers.__version__, "tensors": tensors}
    path = os.path.join(out_dir, f"{name}.json")
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in tensors.items()]
    head = {k: v for k, v in fixture.items() if k != "tensors"}
    with open(path, "w") as f:
        f.write(json.dumps(head, indent=1)[:-2] + ',\n "tensors": {\n' + ",\n".join(lines) + "\n }\n}\n")
    print(f"{path}: {type(model).__name__}, {len(tensors)} tensors")


def load_report(cls, folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, info = cls.from_pretrained(folder, output_loading_info=True, dtype=torch.bfloat16)
    return type(model).__name__, info


def check_init(name, ctune, scratch):
    out = os.path.join(scratch, "init-" + name)
    subprocess.run([ctune, "init", "--config", os.path.join(ROOT, "configs", "models", name), "--out", out],
                   check=True, stdout=subprocess.DEVNULL)
    ok = True
    config = AutoConfig.from_pretrained(out)
    classes = [AutoModelForCausalLM] + ([AutoModelForImageTextToText] if config.model_type in WRAPPERS else [])
    for cls in classes:
        cname, info = load_report(cls, out)
        missing = [k for k in info["missing_keys"] if not (cls is AutoModelForImageTextToText and "visual" in k)]
        vision = len(info["missing_keys"]) - len(missing)
        bad = missing or info["unexpected_keys"] or info["mismatched_keys"] or info.get("error_msgs")
        print(f"{name}: {cls.__name__} -> {cname}: missing {missing}, unexpected {info['unexpected_keys']}, "
              f"mismatched {info['mismatched_keys']}" + (f" (vision tower: {vision} missing, as expected)" if vision else ""))
        ok = ok and not bad
    return ok


def main():
    transformers.logging.set_verbosity_error()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "gdn_models"))
    ap.add_argument("--ctune", help="a ctune binary: also check that HF loads what `ctune init` writes")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ok = True
    with tempfile.TemporaryDirectory() as scratch:
        for name in MODELS:
            write_fixture(name, args.out, scratch)
        if args.ctune:
            for name in MODELS:
                ok = check_init(name, args.ctune, scratch) and ok
    if not ok:
        sys.exit("HF did not load every ctune init folder cleanly")


if __name__ == "__main__":
    main()
