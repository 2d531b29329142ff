#!/usr/bin/env python3
"""prepare_data.py — chat or text JSONL -> token-id JSONL -> ctune shards.

The trainer never tokenizes: this script applies the model's tokenizer and chat
template, builds the assistant-only labels, writes token-id JSONL
({"input_ids":[...], "labels":[...]}, labels -100 = no loss, else equal to
input_ids) and hands it to `ctune prepare`, which writes the shards.

Input, one JSON object per line (blank lines are skipped):
    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
        chat: loss only on assistant turns (content + end-of-turn token)
    {"text": "..."}
        plain text: loss on every token; the document ends with an end-of-text token

Usage:
    # train/eval split made by ctune prepare: DIR/train.shard and DIR/eval.shard
    python3 scripts/prepare_data.py --in chat.jsonl --tokenizer bytes --out DIR --eval-fraction 0.05

    # one file -> one shard, DIR/NAME.shard (the bundled data uses this)
    python3 scripts/prepare_data.py --in data/arith/chat_train.jsonl --tokenizer bytes --out data/arith --split-name train
    python3 scripts/prepare_data.py --in data/arith/chat_eval.jsonl  --tokenizer bytes --out data/arith --split-name eval

    # token-id JSONL only (no ctune binary needed): DIR/NAME.ids.jsonl (NAME: --split-name, else "data")
    python3 scripts/prepare_data.py --in chat.jsonl --tokenizer models/qwen3-0.6b --out DIR --jsonl-only

Options:
    --in FILE          input JSONL (required)
    --out DIR          output folder (created if missing; required)
    --tokenizer T      "bytes" (default): the byte tokenizer of the tiny models
                       (scripts/byte_tokenizer.py, vocab 384); or PATH, a Hugging Face
                       model folder read with transformers.AutoTokenizer (local files only)
    --split-name NAME  write the whole input to DIR/NAME.shard (ctune prepare runs with
                       --eval-fraction 0 into a temporary folder; its train.shard is moved)
    --eval-fraction F  passed to ctune prepare (not with --split-name)
    --max-length N     truncate longer samples to N tokens (counted and reported); a
                       sample left with no loss token is dropped (counted)
    --vocab-size V     passed to ctune prepare; default 384 for bytes, else config.json's
                       vocab_size in the model folder, else len(tokenizer)
    --seed S           passed to ctune prepare (its train/eval shuffle)
    --ctune PATH       the ctune binary (default build/ctune)
    --jsonl-only       stop after writing DIR/NAME.ids.jsonl
    --keep-jsonl       also keep DIR/NAME.ids.jsonl when running ctune prepare

Assistant-only mask with an HF tokenizer:
  * If the chat template has {% generation %} blocks, the mask comes from
    apply_chat_template(..., return_assistant_tokens_mask=True).
  * Otherwise (fallback) it is computed from rendered text: for each assistant
    message i, the turn's text is render(messages[:i+1]) minus its prefix
    render(messages[:i], add_generation_prompt=True) (so the role header stays in
    the prefix), with trailing whitespace after the end-of-turn token removed.
    That text is located in the rendering of the whole conversation, which is
    tokenized once with offsets (fast tokenizers only); every token overlapping
    an assistant span gets mask 1. A template whose rendering of a turn changes
    once later turns follow (one that rewrites past turns), and a conversation
    that opens with an assistant message, are reported as errors: add
    {% generation %} to the template instead.

Exit codes: 0 success, 1 runtime failure (ctune missing or failing), 2 bad input
or usage (a bad line is named as FILE:LINE).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import byte_tokenizer  # noqa: E402

IGNORE = -100


class InputError(Exception):
    """Bad input or usage: exit 2."""


class RuntimeFailure(Exception):
    """Something outside the input failed: exit 1."""


class BytesTokenizer:
    name = "bytes"
    default_vocab_size = byte_tokenizer.VOCAB_SIZE

    def chat(self, messages):
        return byte_tokenizer.encode_chat(messages)

    def text(self, text):
        return byte_tokenizer.encode_text(text)


GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


class HFTokenizer:
    def __init__(self, path):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise InputError("--tokenizer %s needs the 'transformers' package (pip install transformers); "
                             "use --tokenizer bytes for the tiny models" % path)
        if not os.path.isdir(path):
            raise InputError("--tokenizer %s: not 'bytes' and not a folder" % path)
        try:
            self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as e:
            raise InputError("--tokenizer %s: cannot load a tokenizer: %s" % (path, e))
        self.name = path
        self.template = self.tok.chat_template or ""
        if isinstance(self.template, dict):
            self.template = self.template.get("default", "")
        self.has_generation = bool(GENERATION_TAG.search(self.template))
        self.default_vocab_size = len(self.tok)
        cfg = os.path.join(path, "config.json")
        if os.path.exists(cfg):
            with open(cfg, encoding="utf-8") as f:
                c = json.load(f)
            v = c.get("vocab_size") or c.get("text_config", {}).get("vocab_size")
            if isinstance(v, int) and v > 0:
                self.default_vocab_size = v

    def chat(self, messages):
        if not self.template:
            raise InputError("%s has no chat template, so chat samples cannot be rendered" % self.name)
        if self.has_generation:
            out = self.tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                               return_assistant_tokens_mask=True)
            return list(out["input_ids"]), list(out["assistant_masks"])
        return self._chat_fallback(messages)

    def _render(self, messages, add_generation_prompt=False):
        return self.tok.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)

    def _chat_fallback(self, messages):
        if not self.tok.is_fast:
            raise InputError("%s: the chat template has no {%% generation %%} block and the tokenizer "
                             "is not a fast one (no offsets), so the assistant mask cannot be computed"
                             % self.name)
        full = self._render(messages)
        spans = []
        cursor = 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            if i == 0:  # transformers renders no empty conversation, so there is no prefix to subtract
                raise InputError("the conversation starts with an assistant message; the fallback mask "
                                 "needs a message before it (or a template with {% generation %})")
            prefix = self._render(messages[:i], add_generation_prompt=True)
            upto = self._render(messages[:i + 1])
            if not upto.startswith(prefix):
                raise InputError("chat template renders the prompt before assistant message %d differently "
                                 "with and without the reply; add {%% generation %%} to the template" % i)
            turn = upto[len(prefix):].rstrip()
            pos = full.find(turn, cursor)
            if pos < 0:
                raise InputError("chat template renders assistant message %d differently once later turns "
                                 "follow; add {%% generation %%} to the template" % i)
            spans.append((pos, pos + len(turn)))
            cursor = pos + len(turn)
        enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        mask = [0] * len(ids)
        for j, (s, e) in enumerate(enc["offset_mapping"]):
            for a, b in spans:
                if s < b and e > a:
                    mask[j] = 1
                    break
        return ids, mask

    def text(self, text):
        ids = list(self.tok(text, add_special_tokens=True)["input_ids"])
        eos = self.tok.eos_token_id
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        return ids


def check_messages(messages):
    """Returns a reason string when messages is not a valid conversation, else None."""
    if not isinstance(messages, list) or not messages:
        return "\"messages\" must be a non-empty list"
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            return "messages[%d] is not an object" % k
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                return "messages[%d] has no string \"%s\"" % (k, key)
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant message, so no token would carry loss"
    return None


def tokenize_file(path, tokenizer, max_length):
    """Reads the input JSONL; returns (samples, stats). Each sample is
    (input_ids, labels). Raises InputError naming FILE:LINE on a bad line."""
    samples = []
    stats = {"lines": 0, "chat": 0, "text": 0, "truncated": 0, "dropped": 0}
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise InputError("--in %s: %s" % (path, e.strerror))
    with f:
        lineno = 0
        while True:
            lineno += 1
            try:
                line = f.readline()
            except UnicodeDecodeError:
                raise InputError("%s:%d: not valid UTF-8" % (path, lineno))
            if not line:
                break
            if not line.strip():
                continue
            where = "%s:%d" % (path, lineno)
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError("%s: invalid JSON (%s)" % (where, e))
            if not isinstance(obj, dict):
                raise InputError("%s: expected a JSON object with \"messages\" or \"text\"" % where)
            stats["lines"] += 1
            if "messages" in obj:
                reason = check_messages(obj["messages"])
                if reason:
                    raise InputError("%s: %s" % (where, reason))
                try:
                    ids, mask = tokenizer.chat(obj["messages"])
                except InputError as e:
                    raise InputError("%s: %s" % (where, e))
                except Exception as e:  # the HF template may reject a conversation (role order, ...)
                    raise InputError("%s: chat template failed: %s" % (where, e))
                labels = [t if m else IGNORE for t, m in zip(ids, mask)]
                if all(l == IGNORE for l in labels):
                    raise InputError("%s: the chat template marked no assistant token" % where)
                stats["chat"] += 1
            elif "text" in obj:
                if not isinstance(obj["text"], str) or not obj["text"]:
                    raise InputError("%s: \"text\" must be a non-empty string" % where)
                ids = tokenizer.text(obj["text"])
                labels = list(ids)
                stats["text"] += 1
            else:
                raise InputError("%s: expected a \"messages\" or a \"text\" key" % where)
            if max_length and len(ids) > max_length:
                stats["truncated"] += 1
                ids, labels = ids[:max_length], labels[:max_length]
                if all(l == IGNORE for l in labels):
                    stats["dropped"] += 1
                    continue
            samples.append((ids, labels))
    if not samples:
        raise InputError("%s: no samples" % path)
    return samples, stats


def write_ids_jsonl(path, samples):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for ids, labels in samples:
            f.write(json.dumps({"input_ids": ids, "labels": labels}, separators=(",", ":")) + "\n")


def check_ctune(ctune):
    if not (os.path.isfile(ctune) and os.access(ctune, os.X_OK)):
        raise RuntimeFailure("ctune binary not found at %s\nHINT: build it with `make`, pass --ctune PATH, "
                             "or use --jsonl-only" % ctune)


def run_ctune(ctune, ids_path, out_dir, args, vocab_size):
    cmd = [ctune, "prepare", "--in", ids_path, "--out", out_dir, "--vocab-size", str(vocab_size)]
    if args.split_name:
        cmd += ["--eval-fraction", "0"]
    elif args.eval_fraction is not None:
        cmd += ["--eval-fraction", repr(args.eval_fraction)]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    print("prepare_data: " + " ".join(cmd), file=sys.stderr)
    rc = subprocess.call(cmd)
    if rc != 0:
        raise RuntimeFailure("ctune prepare failed (exit %d)" % rc)


def parse_args(argv):
    ap = argparse.ArgumentParser(description="chat/text JSONL -> token-id JSONL -> ctune shards "
                                             "(see the top of this file)")
    ap.add_argument("--in", dest="input", required=True, metavar="FILE")
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--tokenizer", default="bytes", metavar="bytes|PATH")
    ap.add_argument("--split-name", metavar="NAME")
    ap.add_argument("--eval-fraction", type=float, metavar="F")
    ap.add_argument("--max-length", type=int, metavar="N")
    ap.add_argument("--vocab-size", type=int, metavar="V")
    ap.add_argument("--seed", type=int, metavar="S")
    ap.add_argument("--ctune", default="build/ctune", metavar="PATH")
    ap.add_argument("--jsonl-only", action="store_true")
    ap.add_argument("--keep-jsonl", action="store_true")
    args = ap.parse_args(argv)  # argparse exits 2 on a usage error
    if args.split_name is not None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.split_name) or args.split_name.startswith("."):
            raise InputError("--split-name %r: use letters, digits, '_', '-', '.'" % args.split_name)
        if args.eval_fraction:
            raise InputError("--split-name writes one shard; --eval-fraction does not apply")
    if args.eval_fraction is not None and not 0.0 <= args.eval_fraction < 1.0:
        raise InputError("--eval-fraction %g: must be in [0, 1)" % args.eval_fraction)
    if args.max_length is not None and args.max_length < 2:
        raise InputError("--max-length %d: must be at least 2" % args.max_length)
    if args.vocab_size is not None and args.vocab_size < 1:
        raise InputError("--vocab-size %d: must be positive" % args.vocab_size)
    return args


def main(argv):
    args = parse_args(argv)
    if not args.jsonl_only:
        check_ctune(args.ctune)
    tokenizer = BytesTokenizer() if args.tokenizer == "bytes" else HFTokenizer(args.tokenizer)
    vocab_size = args.vocab_size or tokenizer.default_vocab_size

    samples, st = tokenize_file(args.input, tokenizer, args.max_length)
    top = max(max(ids) for ids, _ in samples)
    if top >= vocab_size:
        raise InputError("token id %d >= vocab size %d (pass the model's --vocab-size)" % (top, vocab_size))

    lengths = [len(ids) for ids, _ in samples]
    n_tok = sum(lengths)
    n_loss = sum(sum(1 for l in labels if l != IGNORE) for _, labels in samples)
    msg = ("prepare_data: %s: %d samples (%d chat, %d text lines read), tokenizer %s, vocab %d; "
           "%d tokens, %d with loss (%.1f%%); length min %d mean %.1f max %d"
           % (args.input, len(samples), st["chat"], st["text"], tokenizer.name, vocab_size, n_tok, n_loss,
              100.0 * n_loss / n_tok, min(lengths), n_tok / len(samples), max(lengths)))
    if args.max_length:
        msg += "; %d truncated to %d tokens, %d of them dropped (no loss token left)" % (
            st["truncated"], args.max_length, st["dropped"])
    print(msg, file=sys.stderr)

    os.makedirs(args.out, exist_ok=True)
    name = args.split_name or "data"
    ids_path = os.path.join(args.out, name + ".ids.jsonl")
    if args.jsonl_only:
        write_ids_jsonl(ids_path, samples)
        print("prepare_data: wrote %s" % ids_path, file=sys.stderr)
        return 0

    tmp = tempfile.mkdtemp(prefix=".prepare-", dir=args.out)
    try:
        tmp_ids = os.path.join(tmp, "ids.jsonl")
        write_ids_jsonl(tmp_ids, samples)
        if args.split_name:
            run_ctune(args.ctune, tmp_ids, tmp, args, vocab_size)
            made = os.path.join(tmp, "train.shard")
            if not os.path.exists(made):
                raise RuntimeFailure("ctune prepare wrote no %s" % made)
            dest = os.path.join(args.out, args.split_name + ".shard")
            os.replace(made, dest)
            print("prepare_data: wrote %s" % dest, file=sys.stderr)
        else:
            run_ctune(args.ctune, tmp_ids, args.out, args, vocab_size)
        if args.keep_jsonl:
            os.replace(tmp_ids, ids_path)
            print("prepare_data: wrote %s" % ids_path, file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except InputError as e:
        print("prepare_data: error: %s" % e, file=sys.stderr)
        sys.exit(2)
    except RuntimeFailure as e:
        print("prepare_data: error: %s" % e, file=sys.stderr)
        sys.exit(1)
