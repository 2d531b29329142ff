import sys, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
W = sys.argv[1]
ids = torch.tensor([[257] + list(b"user\nWhat is 12 plus 30?") + [258, 10, 257] + list(b"assistant\n")])
merged = AutoModelForCausalLM.from_pretrained(f"{W}/merged", dtype=torch.float32)
base = AutoModelForCausalLM.from_pretrained(f"{W}/tiny", dtype=torch.float32)
peft = PeftModel.from_pretrained(base, f"{W}/run/final")
with torch.no_grad():
    a = merged(ids).logits
    b = peft(ids).logits
err = ((a - b).abs().max() / b.abs().max()).item()
print(f"HF: merged folder vs PEFT base+adapter (fp32): normwise logits err {err:.2e}; "
      f"argmax agreement {(a.argmax(-1) == b.argmax(-1)).float().mean().item():.3f}")
