"""prepare_text_fixtures.py — the expected answers of tests/test_prepare_text.c
and tests/prepare_text.test.sh, made by Hugging Face transformers and tokenizers
(CI has no Python and uses the stored files).

    /work/venv-hf/bin/python scripts/prepare_text_fixtures.py [--out DIR]

Writes, under --out (default tests/fixtures/prepare_text):
    models/NAME/         a model folder for `ctune prepare --tokenizer`: a fixture
                         tokenizer.json of tests/fixtures/tokenizer (with a
                         post-processor where the real model has one) and a
                         tokenizer_config.json with a chat template of
                         tests/fixtures/chat_templates and the special tokens:
                           qwen    bl_qwen2, the Qwen2 template (default system turn)
                           llama3  bl_llama3, the Llama-3 template, BOS <|begin_of_text|>
                                   added by a TemplateProcessing post-processor
                           llama2  sp_llama2, the Llama-2 template, BOS <s> likewise
                           qwen_gen   bl_qwen2, chatml_generation: {% generation %} around
                                      each assistant reply and its <|im_end|>
                           gen_edges  bl_qwen2 with a trimming ByteLevel post-processor,
                                      generation_edges: blocks with whitespace control,
                                      nested, empty, in a macro, in a {% set %} block
    FORMAT.jsonl         small inputs, one per format: messages, sharegpt, alpaca,
                         prompt_completion (strings and conversations), text; and
                         generation.jsonl, chats (--format messages) for the models whose
                         template has {% generation %}
    expected.json        {"records": {NAME: {FORMAT: [{"input_ids", "mask"}]}},
                         FORMAT "generation" for those models only,
                          "offsets": {TOKENIZER: [{"text", "ids", "spans"}]},
                          "generate": {NAME: [{"system", "prompt", "ids"}]}}

What the answers are (the rules `ctune prepare` follows, see src/text/prepare_text.h):
  * chat formats (messages, sharegpt, alpaca): prepare_data.py's mask, its own
    code (HFTokenizer.chat): for a template with {% generation %} (qwen_gen,
    gen_edges) apply_chat_template(..., return_assistant_tokens_mask=True), else
    the fallback (HFTokenizer._chat_fallback): the conversation rendered by
    apply_chat_template, tokenized once with offsets, mask 1 on tokens that
    overlap an assistant turn;
  * text: prepare_data.py's HFTokenizer.text (add_special_tokens=True, then eos);
  * prompt_completion: TRL 1.14's SFTTrainer tokenize step: strings get the
    eos_token appended to the completion (add_eos), prompt_ids =
    tokenizer(prompt), ids = tokenizer(prompt + completion); conversations:
    prompt_ids = apply_chat_template(prompt, add_generation_prompt=True), ids =
    apply_chat_template(prompt + completion); mask 0 on the first
    len(prompt_ids) tokens, 1 after;
  * generate: the prompt `ctune generate --prompt P [--system S]` feeds:
    apply_chat_template([system?, user], add_generation_prompt=True, tokenize=True);
  * offsets: tokenizers' encode(text, add_special_tokens=False).offsets for every
    valid-UTF-8 string of tests/fixtures/tokenizer/corpus.json and a few chat
    renderings, converted from characters to UTF-8 bytes.
"""
import argparse
import json
import os
import shutil
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import prepare_data  # noqa: E402

TOKENIZERS = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
TEMPLATES = os.path.join(ROOT, "tests", "fixtures", "chat_templates")

# name: (tokenizer fixture, template, bos, eos, post-processor BOS or None)
MODELS = {
    "qwen": ("bl_qwen2", "qwen2", None, "<|im_end|>", None),
    "llama3": ("bl_llama3", "llama3", "<|begin_of_text|>", "<|eot_id|>", "<|begin_of_text|>"),
    "llama2": ("sp_llama2", "llama2", "<s>", "</s>", "<s>"),
    "qwen_gen": ("bl_qwen2", "chatml_generation", None, "<|im_end|>", None),
    "gen_edges": ("bl_qwen2", "generation_edges", None, "<|im_end|>", None),
}
# Another post-processor than the fixture's: ByteLevel's trim_offsets leaves a token's edge spaces
# outside its offsets, so a generation span can start or end on a character no token holds.
POST_PROCESSORS = {
    "gen_edges": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
}

MESSAGES = [
    [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "2 plus 3 is 5."}],
    [{"role": "system", "content": "You answer briefly."},
     {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another one, please."}, {"role": "assistant", "content": "  Green, then.  "}],
    [{"role": "user", "content": "Übersetze: «Guten Morgen» — 早上好 🌅"},
     {"role": "assistant", "content": "Good morning! (早上好 means the same.)\n\nSee you."}],
    [{"role": "user", "content": "Write <|im_end|> and </s> literally."},
     {"role": "assistant", "content": "tabs\tand\nnewlines\r\nand 12345 digits"}],
]

SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello! How can I help?"}]},
    {"conversations": [{"from": "system", "value": "Be terse."}, {"from": "human", "value": "2+2?"},
                       {"from": "gpt", "value": "4"}, {"from": "human", "value": "and 3+3?"},
                       {"from": "gpt", "value": "6"}]},
]

ALPACA = [
    {"instruction": "Give the opposite of the word.", "input": "hot", "output": "cold"},
    {"instruction": "List three primes.", "input": "", "output": "2, 3, 5"},
    {"instruction": "Summarise in one word.", "output": "Brevity."},
]

PROMPT_COMPLETION = [
    {"prompt": "The capital of France is", "completion": " Paris."},
    {"prompt": "Q: 7 times 6?\nA:", "completion": " 42"},
    {"prompt": [{"role": "user", "content": "Say yes."}], "completion": [{"role": "assistant", "content": "Yes."}]},
    {"prompt": [{"role": "system", "content": "Count."}, {"role": "user", "content": "1, 2, ..."}],
     "completion": [{"role": "assistant", "content": "3, 4, 5"}]},
]

TEXT = [
    {"text": "A plain document. It has two sentences."},
    {"text": "Zeilen\nmit Umlauten: äöü, and emoji 🙂 at the end"},
    {"text": "  leading spaces and <|endoftext|> inside"},
]


# Chats for the templates with {% generation %} (generation.jsonl, read as --format messages), for
# generation_edges' branches (by message index mod 4: 1 whitespace control, 3 the macro, else
# nested blocks) and the trimmed offsets of gen_edges: a reply that ends in spaces (no token
# holds its last character: the mask runs to the end), one that starts with them (no token holds
# its first: that span and every later one are dropped), a chat that opens with the assistant.
GENERATION = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."},
     {"role": "user", "content": "And?"}, {"role": "assistant", "content": "Bye now  "}],
    [{"role": "user", "content": "1"}, {"role": "assistant", "content": "one"},
     {"role": "user", "content": "2"}, {"role": "assistant", "content": "two"},
     {"role": "user", "content": "3"}, {"role": "assistant", "content": "  three"},
     {"role": "user", "content": "4"}, {"role": "assistant", "content": "four"}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "Done.  "},
     {"role": "user", "content": "More?"}, {"role": "assistant", "content": "Yes."}],
    [{"role": "assistant", "content": "I open."}, {"role": "user", "content": "ok"},
     {"role": "assistant", "content": "fine"}],
]


def alpaca_messages(r):
    user = r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")
    return [{"role": "user", "content": user}, {"role": "assistant", "content": r["output"]}]


SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}


def sharegpt_messages(r):
    return [{"role": SHAREGPT_ROLES.get(m["from"], m["from"]), "content": m["value"]} for m in r["conversations"]]


def ids_of(out):
    """apply_chat_template(tokenize=True) returns ids or a BatchEncoding, by version."""
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def prompt_completion(tok, r):
    if isinstance(r["prompt"], list):
        prompt_ids = ids_of(tok.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True))
        ids = ids_of(tok.apply_chat_template(r["prompt"] + r["completion"], tokenize=True))
    else:
        completion = r["completion"]
        if tok.eos_token and not completion.endswith(tok.eos_token):
            completion += tok.eos_token
        prompt_ids = list(tok(r["prompt"])["input_ids"])
        ids = list(tok(r["prompt"] + completion)["input_ids"])
    k = min(len(prompt_ids), len(ids))
    return ids, [0] * k + [1] * (len(ids) - k)


def write_model(out, name):
    fixture, template, bos, eos, pp_bos = MODELS[name]
    d = os.path.join(out, "models", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(TOKENIZERS, fixture, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    if pp_bos:
        bos_id = next(a["id"] for a in tj["added_tokens"] if a["content"] == pp_bos)
        tj["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": pp_bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": pp_bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": pp_bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {pp_bos: {"id": pp_bos, "ids": [bos_id], "tokens": [pp_bos]}},
        }
    if name in POST_PROCESSORS:
        tj["post_processor"] = POST_PROCESSORS[name]
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(TEMPLATES, template + ".jinja"), encoding="utf-8") as f:
        chat_template = f.read()
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": chat_template,
           "bos_token": bos, "eos_token": eos, "model_max_length": 1000000}
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    return d


def write_inputs(out):
    sets = {"messages": [{"messages": m} for m in MESSAGES], "sharegpt": SHAREGPT, "alpaca": ALPACA,
            "prompt_completion": PROMPT_COMPLETION, "text": TEXT}
    sets["generation"] = [{"messages": m} for m in GENERATION]
    for fmt, rows in sets.items():
        with open(os.path.join(out, fmt + ".jsonl"), "w", encoding="utf-8", newline="\n") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return sets


def expected_records(model_dir, sets):
    hf = prepare_data.HFTokenizer(model_dir)
    tok = hf.tok
    out = {}

    def chat(messages):
        ids, mask = hf.chat(messages)
        return {"input_ids": ids, "mask": mask}

    out["messages"] = [chat(r["messages"]) for r in sets["messages"]]
    out["sharegpt"] = [chat(sharegpt_messages(r)) for r in sets["sharegpt"]]
    out["alpaca"] = [chat(alpaca_messages(r)) for r in sets["alpaca"]]
    if hf.has_generation:
        out["generation"] = [chat(r["messages"]) for r in sets["generation"]]
    out["prompt_completion"] = []
    for r in sets["prompt_completion"]:
        ids, mask = prompt_completion(tok, r)
        out["prompt_completion"].append({"input_ids": ids, "mask": mask})
    out["text"] = []
    for r in sets["text"]:
        ids = hf.text(r["text"])
        out["text"].append({"input_ids": ids, "mask": [1] * len(ids)})
    return out


GENERATE = [(None, "What is 2 plus 3?"), ("Be brief.", "What is 2 plus 3?")]


def expected_generate(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    rows = []
    for system, prompt in GENERATE:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        ids = ids_of(tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True))
        rows.append({"system": system, "prompt": prompt, "ids": ids})
    return rows


def byte_spans(text, offsets):
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode("utf-8")))
    return [[pos[s], pos[e]] for s, e in offsets]


def expected_offsets(out_models):
    with open(os.path.join(TOKENIZERS, "corpus.json"), encoding="utf-8") as f:
        texts = [c["text"] for c in json.load(f) if "text" in c]
    extra = []
    for name in MODELS:
        tok = AutoTokenizer.from_pretrained(os.path.join(out_models, name), local_files_only=True)
        for m in MESSAGES:
            extra.append(tok.apply_chat_template(m, tokenize=False))
    res = {}
    for name in sorted(os.listdir(TOKENIZERS)):
        path = os.path.join(TOKENIZERS, name, "tokenizer.json")
        if not os.path.isfile(path):
            continue
        t = Tokenizer.from_file(path)
        rows = []
        for s in texts + extra:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                continue
            e = t.encode(s, add_special_tokens=False)
            rows.append({"text": s, "ids": e.ids, "spans": byte_spans(s, e.offsets)})
        res[name] = rows
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "prepare_text"))
    args = ap.parse_args()
    if os.path.isdir(os.path.join(args.out, "models")):
        shutil.rmtree(os.path.join(args.out, "models"))
    os.makedirs(args.out, exist_ok=True)
    dirs = {name: write_model(args.out, name) for name in MODELS}
    sets = write_inputs(args.out)
    import tokenizers
    import transformers
    expected = {"versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
                "records": {name: expected_records(d, sets) for name, d in dirs.items()},
                "offsets": expected_offsets(os.path.join(args.out, "models")),
                "generate": {name: expected_generate(d) for name, d in dirs.items()}}
    with open(os.path.join(args.out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("wrote %s" % args.out)


if __name__ == "__main__":
    main()
