"""quant4_write_fixtures.py — what tests/test_quant4_write.c must write, made
by the real bitsandbytes on the CPU (CI has no Python and uses the stored file).

    /work/venv-hf/bin/python scripts/quant4_write_fixtures.py [--dir DIR]

Writes DIR/write.safetensors (default tests/fixtures/quant4): for each CASES
entry PREFIX (quant type, blocksize, double quant, shape), PREFIX.input (the
BF16 weight) and the state_dict a bf16 bnb.nn.Linear4bit saves for it
(PREFIX.weight and its .absmax, .quant_map, .nested_*, .quant_state.*: the
keys transformers' save_pretrained writes), byte for byte. The shapes give an
odd element count, a short last block and several nested blocks.
"""
import argparse
import os

import bitsandbytes as bnb
import torch
from safetensors.torch import save_file

# (prefix, quant_type, blocksize, double_quant, [out, in])
CASES = [
    ("nf4.dq", "nf4", 64, True, [24, 100]),
    ("nf4.bs128", "nf4", 128, False, [5, 77]),
    ("fp4", "fp4", 64, False, [16, 70]),
    ("fp4.dq.bs32.nested3", "fp4", 32, True, [65, 256]),
    ("nf4.dq.bs32", "nf4", 32, True, [3, 1000]),
]


def linear4bit(prefix, qt, bs, dq, shape, g):
    w = (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)
    lin = bnb.nn.Linear4bit(shape[1], shape[0], bias=False, compress_statistics=dq, quant_type=qt,
                            compute_dtype=torch.bfloat16, quant_storage=torch.uint8)
    lin.weight = bnb.nn.Params4bit(w.clone(), requires_grad=False, blocksize=bs, compress_statistics=dq, quant_type=qt)
    lin = lin.to("cpu")
    assert lin.weight.bnb_quantized
    sd = {f"{prefix}.{k}": v.contiguous() for k, v in lin.state_dict().items()}
    sd[f"{prefix}.input"] = w
    return sd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="tests/fixtures/quant4")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(11)
    sd = {}
    for case in CASES:
        sd.update(linear4bit(*case, g))
    meta = {"made_by": f"bitsandbytes {bnb.__version__}, torch {torch.__version__} "
                       f"({torch.backends.cpu.get_cpu_capability()})"}
    path = os.path.join(args.dir, "write.safetensors")
    save_file(sd, path, metadata=meta)
    print(f"wrote {path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
