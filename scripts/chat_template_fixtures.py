"""chat_template_fixtures.py — the expected renders of tests/test_chat_template.c,
made by transformers' own chat-template renderer (pip install transformers
jinja2); CI has no Python and uses the stored expected.json.

    /work/venv-hf/bin/python scripts/chat_template_fixtures.py [--dir DIR]

Reads, under --dir (default tests/fixtures/chat_templates):
    NAME.jinja           a chat template (TEMPLATES below gives its bos/eos tokens); the
                         COMPOSED ones are written first, from the parts COMPOSED names
    conversations.json   [{"name": ..., "messages": [{"role": ..., "content": ...}]}]
Writes DIR/expected.json: the versions used, the fixed clock, each template's
special tokens, and for every (template, conversation, add_generation_prompt)
case either "text" (what apply_chat_template(messages, tokenize=False,
add_generation_prompt=...) returns) or "error" and "error_type" (what it raised:
TemplateError for raise_exception(), UndefinedError, TypeError ...). A template
with a {% generation %} tag also gets "spans": the [start, end) of each block's
text as transformers records them for return_assistant_tokens_mask (its
generation_indices), converted from characters to UTF-8 bytes.

The renderer is transformers.utils.chat_template_utils.render_jinja_template,
which is what tokenizer.apply_chat_template calls: the same sandboxed jinja2
environment (trim_blocks, lstrip_blocks, loopcontrols, the generation tag), the
same globals (raise_exception, strftime_now) and tojson filter, and the special
tokens passed as variables as apply_chat_template passes special_tokens_map
(a token that is None is not passed, so the template sees it undefined).
strftime_now reads a fixed clock (DATE): transformers' module sees a datetime
whose now() is DATE, and the C test sets the same date (chat_template_set_date).
"""
import argparse
import datetime as real_datetime
import json
import os
import platform
import re
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATE = real_datetime.datetime(2025, 3, 9, 14, 5, 7)
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")   # transformers' test, and prepare_data.py's

# name: (bos_token, eos_token), as in the models' tokenizer_config.json (None: absent).
TEMPLATES = {
    "chatml": (None, "<|im_end|>"),
    "qwen2": (None, "<|im_end|>"),
    "qwen2_5": (None, "<|im_end|>"),
    "qwen3": (None, "<|im_end|>"),
    "llama2": ("<s>", "</s>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral_v1": ("<s>", "</s>"),
    "mistral_v3": ("<s>", "</s>"),
    "mistral_small3": ("<s>", "</s>"),
    "gpt_oss": ("<|startoftext|>", "<|return|>"),
    "gpt_oss_tools": ("<|startoftext|>", "<|return|>"),
    "features_expr": ("<s>", None),
    "features_stmt": ("<s>", "</s>"),
    "features_ws": ("<s>", "</s>"),
    "features_crlf": ("<s>", "</s>"),
    "features_str": ("<s>", "</s>"),
    "chatml_generation": (None, "<|im_end|>"),
    "generation_edges": (None, "<|im_end|>"),
}

# name: the files whose concatenation this script writes as NAME.jinja before rendering it.
# ctune passes messages of role and content and tools=None, so what gpt_oss.jinja does with
# tools, thinking and tool calls is reached through a prelude that sets them from the template.
COMPOSED = {
    "gpt_oss_tools": ("gpt_oss_tools.prelude", "gpt_oss.jinja"),
}


class FixedDatetime(real_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return DATE


def byte_offset(text, char):
    """Characters -> UTF-8 bytes; a character past the end of text counts as one byte (chat_template.h)."""
    return len(text[:char].encode("utf-8")) + max(0, char - len(text))


def render(template, messages, add_generation_prompt, bos, eos):
    tokens = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    generation = bool(GENERATION_TAG.search(template))
    try:
        out, indices = chat_template_utils.render_jinja_template(
            conversations=[messages], chat_template=template, return_assistant_tokens_mask=generation,
            add_generation_prompt=add_generation_prompt, **tokens)
        case = {"text": out[0]}
        if generation:
            case["spans"] = [[byte_offset(out[0], a), byte_offset(out[0], b)] for a, b in indices[0]]
        return case
    except Exception as e:  # what the template raised is the expected answer
        return {"error": str(e), "error_type": type(e).__name__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(ROOT, "tests", "fixtures", "chat_templates"))
    args = ap.parse_args()
    chat_template_utils.datetime = FixedDatetime
    with open(os.path.join(args.dir, "conversations.json"), encoding="utf-8") as f:
        conversations = json.load(f)
    for name, parts in COMPOSED.items():
        text = ""
        for part in parts:
            with open(os.path.join(args.dir, part), encoding="utf-8", newline="") as f:
                text += f.read()
        with open(os.path.join(args.dir, name + ".jinja"), "w", encoding="utf-8", newline="") as f:
            f.write(text)
    cases = []
    for name, (bos, eos) in TEMPLATES.items():
        # newline="" keeps \r\n: jinja2 normalises newlines itself, as the C lexer does
        with open(os.path.join(args.dir, name + ".jinja"), encoding="utf-8", newline="") as f:
            template = f.read()
        for conv in conversations:
            for agp in (False, True):
                case = {"template": name, "conversation": conv["name"], "add_generation_prompt": agp}
                case.update(render(template, conv["messages"], agp, bos, eos))
                cases.append(case)
    doc = {
        "generator": "scripts/chat_template_fixtures.py",
        "versions": {"transformers": transformers.__version__, "jinja2": jinja2.__version__,
                     "python": platform.python_version()},
        "date": DATE.isoformat(),
        "templates": {n: {"bos_token": b, "eos_token": e} for n, (b, e) in TEMPLATES.items()},
        "cases": cases,
    }
    with open(os.path.join(args.dir, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"{len(cases)} cases ({errors} errors) from {len(TEMPLATES)} templates x "
          f"{len(conversations)} conversations x 2 -> {args.dir}/expected.json", file=sys.stderr)


if __name__ == "__main__":
    main()
