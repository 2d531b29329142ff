#!/usr/bin/env python3
"""bench_qlora.py - QLoRA peers for scripts/bench_qlora.sh: HF + PEFT +
bitsandbytes and Unsloth, each training LoRA on a 4-bit frozen base.

Both quantize the bf16 --model folder on load to NF4 with double quant
(blocksize 64), compute in bf16, LoRA r16 / alpha 32 on q,k,v,o,gate,up,down,
gradient checkpointing on, AdamW 2e-4, one packed row of --tokens-per-step
tokens per step. Data, packing, timing and the result fields are those of the
peer baselines (PEERS_DIR/peers.py, imported: gen_docs, pack_rows, run_mode):
lognormal document lengths, the first 20% of each a prompt, tokens/s over real
tokens, the median over the timed steps, peak memory from torch's allocator.

  hf       transformers + PEFT + bitsandbytes: from_pretrained with
           BitsAndBytesConfig(load_in_4bit, nf4, double quant, bf16 compute),
           sdpa, the packed row fed with restarting position_ids (transformers
           builds a block-diagonal mask; PERF.md measured sdpa leaking across
           documents that way: the figure is labelled leaky). --kbit-prep on
           (default) runs PEFT's prepare_model_for_kbit_training first, as TRL's
           SFTTrainer does for a 4-bit model (norms, embeddings and lm_head in
           fp32, checkpointing with input gradients); off keeps them bf16.
  unsloth  FastLanguageModel.from_pretrained(load_in_4bit=True) (Unsloth's own
           nf4 + double quant, bf16 compute), then as peers.py runs Unsloth in
           bf16: get_peft_model with use_gradient_checkpointing="unsloth", the
           row fed as its padding-free collator does (packed_seq_lengths).
  data     writes peers.py's documents as ctune prepare input (JSON lines of
           input_ids and labels), so that ctune trains on the same tokens.
  collect  turns a part's log into JSON lines (one per measured mode; a failure
           line when there is none), printed and appended to --results.

Each measuring subcommand prints "RESULT {json}" lines (peers.py's format).
--dry (hf, unsloth): a tiny llama on the CPU; hf runs for real there (bnb's CPU
quantizer, fp32 compute for speed), unsloth only checks the data and says what it
would run (Unsloth needs a GPU).
"""
import argparse
import json
import os
import sys
import time
import traceback


def import_peers():
    d = os.environ.get("PEERS_DIR", ".devpeers")
    if not os.path.isfile(os.path.join(d, "peers.py")):
        print(f"{d}: no peers.py (set PEERS_DIR to the peer baselines folder)", file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, os.path.abspath(d))
    import peers
    return peers


def base_fields(a, peer):
    return {"part": a.part, "peer": peer, "model": a.name, "quant": "nf4+dq", "compute": "bf16",
            "lora": "r16 all-linear", "gc": "on", "layout": "packed", "tokens_per_step": a.tokens_per_step,
            "dry": a.dry, "mode": f"{peer} {a.name} qlora nf4 packed"}


def fail_setup(peers, base, t0, e):
    base.update(ok=False, error=peers.err_line(e), setup_s=round(time.perf_counter() - t0, 1))
    traceback.print_exc()
    peers.emit(base)
    return 1


def cmd_hf(a, peers):
    t0 = time.perf_counter()
    base = base_fields(a, "hf-peft-bnb")
    base.update(attn="sdpa (packed via position_ids: leaky)", kbit_prep=a.kbit_prep == "on")
    base["mode"] += f" kbit_prep={a.kbit_prep}"
    try:
        import torch
        import bitsandbytes
        from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
        dev = "cpu" if a.dry else a.device
        compute = torch.float32 if a.dry else torch.bfloat16
        base.update(peers.env_info(torch), bitsandbytes=bitsandbytes.__version__)
        if a.dry:
            base["compute"] = "fp32 (dry)"
        cfg = AutoConfig.from_pretrained(a.model)
        torch.manual_seed(a.seed)
        qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=compute, bnb_4bit_quant_storage=torch.uint8)
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=compute, quantization_config=qc,
                                                     attn_implementation="sdpa", device_map={"": dev})
        model.config.use_cache = False
        base["load_quantize_s"] = round(time.perf_counter() - t0, 1)
        n4 = sum(isinstance(m, bitsandbytes.nn.Linear4bit) for m in model.modules())
        base["linear4bit"] = n4
        peers.log(f"[hf] loaded and quantized {n4} Linear4bit in {base['load_quantize_s']}s")
        gck = {"use_reentrant": False}
        if a.kbit_prep == "on":
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                                    gradient_checkpointing_kwargs=gck)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gck)
            model.enable_input_require_grads()
        pm = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=peers.TARGETS,
                                              bias="none", task_type="CAUSAL_LM"))
        opt, n_train = peers.make_optimizer(torch, pm, a.lr)
        base["trainable_params"] = n_train
        docs = peers.gen_docs(cfg.vocab_size, (a.steps + 5) * a.tokens_per_step, seed=a.seed)
        rows = peers.pack_rows(docs, a.tokens_per_step, a.steps)
        base["segments_per_row"] = round(sum(len(r["seq_lens"]) for r in rows) / len(rows), 2)
        base["setup_s"] = round(time.perf_counter() - t0, 1)
        pm.train()

        def step(row):
            ids, lab, pos, _ = peers.to_dev_packed(torch, dev, row)
            out = pm(input_ids=ids, labels=lab, position_ids=pos, use_cache=False)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return out.loss.detach().float().item()
    except (peers.PartTimeout, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - reported as the part's result
        return fail_setup(peers, base, t0, e)
    res = peers.run_mode(torch, dev, base, step, rows, a.warm, a.steps - a.warm, a.mode_budget)
    return 0 if res.get("ok") else 1


def cmd_unsloth(a, peers):
    t0 = time.perf_counter()
    base = base_fields(a, "unsloth")
    base["gc"] = "unsloth"
    if a.dry:  # Unsloth needs a GPU: check the data and the plan only
        from transformers import AutoConfig
        cfg = AutoConfig.from_pretrained(a.model)
        docs = peers.gen_docs(cfg.vocab_size, (a.steps + 5) * a.tokens_per_step, seed=a.seed)
        rows = peers.pack_rows(docs, a.tokens_per_step, a.steps)
        peers.check_rows(rows, a.tokens_per_step)
        peers.log(f"[unsloth] dry: would load {a.model} with load_in_4bit=True and time {a.steps - a.warm} of "
                  f"{a.steps} steps of {a.tokens_per_step} tokens ({len(rows)} rows made)")
        peers.emit(dict(base, ok=True, steps_timed=0, note="dry run: nothing measured"))
        return 0
    try:
        import unsloth  # noqa: F401  (before transformers / peft, as Unsloth asks)
        from unsloth import FastLanguageModel
        import torch
        dev = "cuda"
        base["unsloth"] = getattr(unsloth, "__version__", "?")
        base.update(peers.env_info(torch))
        model, _tok = FastLanguageModel.from_pretrained(
            model_name=a.model, max_seq_length=a.tokens_per_step, dtype=torch.bfloat16,
            load_in_4bit=True, load_in_8bit=False, full_finetuning=False)
        base["load_quantize_s"] = round(time.perf_counter() - t0, 1)
        try:
            import bitsandbytes
            base["bitsandbytes"] = bitsandbytes.__version__
            base["linear4bit"] = sum(isinstance(m, bitsandbytes.nn.Linear4bit) for m in model.modules())
        except ImportError:
            pass
        peers.log(f"[unsloth] loaded {type(model).__name__} 4-bit in {base['load_quantize_s']}s")
        model = FastLanguageModel.get_peft_model(
            model, r=16, lora_alpha=32, target_modules=peers.TARGETS, lora_dropout=0, bias="none",
            use_gradient_checkpointing="unsloth", random_state=3407, max_seq_length=a.tokens_per_step)
        FastLanguageModel.for_training(model)
        opt, n_train = peers.make_optimizer(torch, model, a.lr)
        base["trainable_params"] = n_train
        docs = peers.gen_docs(model.config.vocab_size, (a.steps + 5) * a.tokens_per_step, seed=a.seed)
        rows = peers.pack_rows(docs, a.tokens_per_step, a.steps)
        base["segments_per_row"] = round(sum(len(r["seq_lens"]) for r in rows) / len(rows), 2)
        base["setup_s"] = round(time.perf_counter() - t0, 1)

        def step(row):
            ids, lab, pos, lens = peers.to_dev_packed(torch, dev, row)
            out = model(input_ids=ids, labels=lab, position_ids=pos, packed_seq_lengths=lens, use_cache=False)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return out.loss.detach().float().item()
    except (peers.PartTimeout, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - reported as the part's result
        return fail_setup(peers, base, t0, e)
    res = peers.run_mode(torch, dev, base, step, rows, a.warm, a.steps - a.warm, a.mode_budget)
    return 0 if res.get("ok") else 1


def cmd_data(a, peers):
    """peers.py's documents (same seed, same lengths) as ctune prepare input."""
    docs = peers.gen_docs(a.vocab, (a.steps + 5) * a.tokens_per_step, seed=a.seed)
    with open(a.out, "w") as f:
        for ids, n_prompt in docs:
            lab = peers.doc_labels(ids, n_prompt)
            f.write(json.dumps({"input_ids": ids.tolist(), "labels": lab.tolist()}) + "\n")
    print(f"{a.out}: {len(docs)} documents, {sum(len(d[0]) for d in docs)} tokens (vocab {a.vocab})")
    return 0


def cmd_collect(a, peers):
    """One JSON line per RESULT of the part's log (or a failure line), printed and appended."""
    res = peers.read_results(a.log) if os.path.exists(a.log) else []
    rc = int(a.rc)
    if not res:
        tail = peers.tail_lines(a.log, 1)
        res = [{"part": a.part, "mode": a.part, "ok": False,
                "error": peers.last_error(a.log) or (tail[0][:300] if tail else f"exit code {rc}, no RESULT line")}]
    extra = json.loads(a.extra) if a.extra else {}
    with open(a.results, "a") as f:
        for r in res:
            r.setdefault("part", a.part)
            r.update(extra, rc=rc, part_elapsed_s=float(a.elapsed))
            if rc in (124, 137) and r.get("ok") is not True:
                r.setdefault("error", "timeout")
            line = json.dumps(r, sort_keys=True)
            f.write(line + "\n")
            print(line, flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def measured(p):
        p.add_argument("--model", required=True, help="bf16 HF model folder (ctune init)")
        p.add_argument("--name", required=True, help="the shape's name, for the result")
        p.add_argument("--part", default="")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--tokens-per-step", type=int, default=16384)
        p.add_argument("--steps", type=int, default=8, help="total steps (warm-up included)")
        p.add_argument("--warm", type=int, default=3)
        p.add_argument("--lr", type=float, default=2e-4)
        p.add_argument("--mode-budget", type=float, default=0.0,
                       help="seconds after which timed steps stop (at least 3 timed; 0 = no cap)")
        p.add_argument("--device", default="cuda")
        p.add_argument("--dry", action="store_true", help="the CPU flow check (see above)")

    p = sub.add_parser("hf")
    measured(p)
    p.add_argument("--kbit-prep", choices=["on", "off"], default="on")
    measured(sub.add_parser("unsloth"))
    p = sub.add_parser("data")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens-per-step", type=int, default=16384)
    p.add_argument("--out", required=True)
    p = sub.add_parser("collect")
    p.add_argument("--log", required=True)
    p.add_argument("--part", required=True)
    p.add_argument("--rc", default="0")
    p.add_argument("--elapsed", default="0")
    p.add_argument("--results", required=True)
    p.add_argument("--extra", default="", help="JSON object merged into every line")
    a = ap.parse_args()
    if a.cmd in ("hf", "unsloth", "data") and (a.steps < 1 or (a.cmd != "data" and not 0 <= a.warm < a.steps)):
        ap.error("--steps must be >= 1 and 0 <= --warm < --steps")
    peers = import_peers()
    import signal
    signal.signal(signal.SIGTERM, peers._on_sigterm)  # a timeout still prints the partial result
    fn = {"hf": cmd_hf, "unsloth": cmd_unsloth, "data": cmd_data, "collect": cmd_collect}[a.cmd]
    try:
        return fn(a, peers)
    except (peers.PartTimeout, KeyboardInterrupt) as e:
        print(f"stopped: {e}", flush=True)
        return 124


if __name__ == "__main__":
    sys.exit(main())
