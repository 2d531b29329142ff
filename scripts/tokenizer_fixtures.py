"""tokenizer_fixtures.py — the tokenizer fixtures of tests/test_tokenizer.c, made
with Hugging Face `tokenizers` (pip install tokenizers); CI has no `tokenizers`
and uses the stored files.

    python3 scripts/tokenizer_fixtures.py                  # train + write tests/fixtures/tokenizer/
    python3 scripts/tokenizer_fixtures.py --out DIR --expect-only [--random N --seed S]

Writes, under --out:
    corpus.json              the stress corpus: [{"text": s} | {"hex": bytes}, ...]
                             (hex for the byte strings that are not UTF-8)
    NAME/tokenizer.json      one tokenizer per NAME below, trained by the
                             `tokenizers` BPE trainer on a small corpus
    NAME/expected.json       HF's answers for every corpus entry, in order:
                             ids (encode, add_special_tokens=False), ids_plain
                             (the same with encode_special_tokens = True),
                             decoded / decoded_skip (decode(ids) with
                             skip_special_tokens False / True)

Tokenizers (the shapes of real tokenizer.json files, small vocabularies):
    bl_qwen2      byte-level BPE, NFC, the Qwen2 split regex
    bl_llama3     byte-level BPE, the Llama-3 regex, ignore_merges (with words in
                  the vocab that merges cannot reach)
    bl_o200k      byte-level BPE, the GPT-OSS (o200k) regex, ignore_merges
    sp_llama2     SentencePiece-style BPE with byte fallback: normalizer
                  Prepend + Replace, decoder Replace/ByteFallback/Fuse/Strip,
                  merges in the older "a b" form
    sp_metaspace  the same model with the Metaspace pre-tokenizer (prepend_scheme
                  first) and the Metaspace decoder
    sp_legacy     the same model with the older Metaspace fields (add_prefix_space,
                  splitting on the replacement character)
    bl_gpt2       byte-level BPE as GPT-2 / RoBERTa: ByteLevel add_prefix_space +
                  use_regex, after Splits MergedWithPrevious / MergedWithNext /
                  Removed, normalizer NFKC + a regex Replace
    wp_suffix     character BPE with continuing_subword_prefix "##",
                  end_of_word_suffix "</w>" and an unk_token (no byte fallback, no
                  fuse_unk), Splits Removed / Isolated (\w) / Contiguous, decoder
                  Replace (string and regex) + Strip

Invalid UTF-8 entries are given to HF as bytes.decode('utf-8', 'replace'): the
C encoder takes the raw bytes and must agree (tokenizer.h).

--expect-only keeps the tokenizer.json files in --out and rewrites
expected.json (and corpus.json, with --random N extra random strings): what
tests/tokenizer.test.sh does to check the C tokenizer against the installed
`tokenizers` on fresh strings.
"""
import argparse
import glob
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, __version__, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])

MULTILINGUAL = """\
The quick brown fox jumps over the lazy dog. Don't stop; it's what we'll do, isn't it?
Le cœur a ses raisons que la raison ne connaît point. Ça va très bien, merci.
Über den Wolken muss die Freiheit wohl grenzenlos sein. Straße, Größe, Äpfel.
¿Dónde está la biblioteca? El niño comió paella en España.
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир!
Η γρήγορη καφέ αλεπού πηδάει πάνω από το τεμπέλικο σκυλί.
我们今天去公园散步，天气非常好。机器学习是人工智能的一个分支。
東京は日本の首都です。ひらがなとカタカナと漢字を使います。
안녕하세요, 만나서 반갑습니다. 한국어는 한글로 씁니다.
مرحبا بالعالم، هذه جملة باللغة العربية. السلام عليكم.
שלום עולם, זה משפט בעברית.
नमस्ते दुनिया, यह हिंदी में एक वाक्य है।
สวัสดีครับ ยินดีต้อนรับสู่ประเทศไทย
Tiếng Việt có nhiều dấu thanh: à á ả ã ạ.
Emoji: 😀 😂 👍🏽 ❤️ 🇯🇵 👨‍👩‍👧‍👦 🏳️‍🌈 — and math: ∑ x² ≤ ∞, π ≈ 3.14159.
def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text if c.isprintable()]  # 42
for (size_t i = 0; i < n; i++) { if (x[i] != 0) sum += x[i] * 2.5f; }
{"name": "ctune", "version": "1.0.0", "ids": [1, 22, 333, 4444]}
https://example.com/path/to/file.html?query=1&lang=en#section-2
"""

# The stress corpus: (label, text or bytes). Bytes that are not UTF-8 go to HF decoded with 'replace'.
STRESS = [
    ("empty", ""), ("space", " "), ("spaces", "     "), ("newline", "\n"), ("tab", "\t"),
    ("english", "The quick brown fox jumps over the lazy dog."),
    ("leading spaces", "   leading and trailing   "),
    ("space runs", "a  b   c    d\t\te\n\n\nf \n g"),
    ("crlf", "line one\r\nline two\r\n\r\nline four\r"),
    ("mixed whitespace", " \n \n  \t\n\u00a0x\u3000y\u2028z\u2029w\u202f\u205fv"),
    ("nel", "a\u0085b \u0085 c\u0085\u0085"),
    ("mongolian vowel separator", "a\u180eb \u180e c"),
    ("zero width", "a\u200bb\u200cc\u200dd\ufeffe"),
    ("contractions", "I'm sure you're right, he's here, they've gone, we'll see, I'd go, don't."),
    ("contractions upper", "I'M SURE YOU'RE RIGHT, HE'S HERE, THEY'VE GONE, WE'LL SEE, DON'T 'S 'T"),
    ("contractions odd", "'s'S'ss 'll'LL'lL 'x' '' ''' 'ſ 'K rock'n'roll it’s"),
    ("digits", "12345678901234567890 3.14159 1,000,000 0x1F 007 2024-01-31"),
    ("unicode digits", "٣٤٥ ١٢٣ ١٢٣٤ ２０２４ ²³ ¼ Ⅻ ⑤ 𝟙𝟚𝟛"),
    ("code python", "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n"),
    ("code c", "int main(void) {\n\tprintf(\"%d\\n\", a[i] >> 2);\n\treturn 0;\n}\n"),
    ("code json", "{\"a\": [1, 2.5, -3e10], \"b\": null, \"c\": \"\\u00e9\"}"),
    ("code html", "<div class=\"x\"><p>Hello &amp; welcome</p><br/></div>"),
    ("url email", "See https://example.org/a/b?c=d&e=f#g or mail me@example.com."),
    ("punctuation runs", "!!! ??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}"),
    ("slashes", "a/b//c///d path/to/file.txt /usr/lib/x86_64-linux-gnu/\n//\n"),
    ("chinese", "我们今天去公园散步，天气非常好。机器学习是人工智能的一个分支。"),
    ("chinese long", "中华人民共和国" * 40),
    ("japanese", "東京は日本の首都です。ひらがな、カタカナ、漢字。ｶﾀｶﾅ"),
    ("korean", "안녕하세요, 만나서 반갑습니다."),
    ("korean jamo", "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af"),
    ("thai", "สวัสดีครับยินดีต้อนรับสู่ประเทศไทย"),
    ("devanagari", "नमस्ते दुनिया, यह हिंदी में एक वाक्य है।"),
    ("arabic", "مرحبا بالعالم، هذه جملة باللغة العربية ١٢٣."),
    ("hebrew", "שלום עולם, זה משפט בעברית."),
    ("rtl marks", "abc \u200fمرحبا\u200e 123 \u202bשלום\u202c def"),
    ("persian zwnj", "می\u200cخواهم بروم"),
    ("emoji", "😀😂🤣 👍🏽 👍🏿 ❤️ ✨ 🎉"),
    ("emoji zwj", "👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 🧑‍🤝‍🧑 🐻‍❄️"),
    ("flags keycaps", "🇯🇵🇺🇸🇫🇷 1️⃣ #️⃣ *️⃣"),
    ("emoji long", "😀" * 200),
    ("combining", "e\u0301 n\u0303 a\u0308\u0301 o\u0302\u0323 Z\u0334\u0321\u0322a\u0337l\u0338g\u0335o"),
    ("combining alone", "\u0301\u0302 \u0303x \u20dd"),
    ("nfc decomposed", "Tie\u0302\u0301ng Vie\u0323\u0302t, cafe\u0301, re\u0301sume\u0301"),
    ("nfc composed", "Tiếng Việt, café, résumé"),
    ("nfc singletons", "\u212b \u2126 \u212a \u00c5 \ufb01 \u2460 \u1e9b\u0323"),
    ("cjk compat", "\uf900\uf901 \u2f00 \u3250"),
    ("greek cyrillic", "Ἀθῆναι Москва ΣΊΣΥΦΟΣ"),
    ("math symbols", "∀x ∈ ℝ: x² ≥ 0 ⇒ √x ∈ ℝ, ∑ᵢ aᵢ ≤ ∞"),
    ("astral", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 𓀀 🀄"),
    ("private use", "\ue000\uf8ff \U000f0000"),
    ("nul", "a\x00b\x00\x00c"),
    ("controls", "\x01\x02\x1b[31mred\x1b[0m\x7f\x08"),
    ("byte-level chars", "ĠĊĉ Ā ā ł Ń ġ"),
    ("metaspace chars", "▁hello ▁▁world▁ ▁"),
    ("byte token text", "<0x41><0xE2><0x82><0xAC> <0x0A>"),
    ("long word", "a" * 3000),
    ("long digits", "1" * 1000),
    ("long spaces", " " * 500 + "x"),
    ("long mixed", "supercalifragilisticexpialidocious" * 30),
    ("repeated pairs", "abababababababababab aaaaaaaa bbbbbbbbb"),
    ("special chat", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"),
    ("special glued", "x<|im_end|>y<|endoftext|>z"),
    ("special partial", "<|im_end <|im_ <| |> <|im_end|"),
    ("special repeated", "<|im_start|><|im_start|><|endoftext|><|endoftext|>"),
    ("special spaces", "  <|lstrip|>  a  <|rstrip|>  b <|lstrip|><|rstrip|> c"),
    ("special rstrip overlap", "<|rstrip|>  <|lstrip|> x <|rstrip|>\u2000\u0085y"),
    ("single word", "<mask> amask <mask>a mask_ <mask>. (<mask>) é<mask> <mask>\u0301"),
    ("added normalized", "café cafe\u0301 cafés xcafé"),
    ("think", "<think>\nreasoning\n</think>\n\nanswer <tool_call>{}</tool_call>"),
    ("llama3 specials", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"),
    ("reserved specials", "<|reserved_special_token_1|><|reserved_special_token_10|><|reserved_special_token_1"),
    ("harmony", "<|start|>assistant<|channel|>final<|message|>Hi<|end|><|return|>"),
    ("sentencepiece specials", "<s>Hello</s> <s> </s>x<unk>"),
    ("sp added normalized", "a <extra> b<extra>c  <extra>"),
    ("split behaviors", "a--b -- c;d|e $x$$y$ --;| $$ ;;"),
    ("word digits", "abc123def 42nd 3.14 x2 \u0663\u0664a \u00b2b 9ie\u2464 \u24b6b \u00bd\u00be \u2074x"),
    ("wordpiece unknowns", "zebra \u00e9\u00e8\u00ea \u4e2d\u6587 \U0001f600 [MASK] a [MASK]b"),
    ("unreachable words", " unreachable tokenization unreachableunreachable Unreachable"),
    ("invalid lone continuation", b"abc\x80def\xbf"),
    ("invalid ff", b"\xff\xfe x \xff"),
    ("invalid truncated", b"\xc3 \xe2\x82 \xf0\x9f\x98 end\xe2"),
    ("invalid surrogate", b"\xed\xa0\x80\xed\xbf\xbf"),
    ("invalid overlong", b"\xc0\xaf\xe0\x80\xaf\xc1\xbf"),
    ("invalid past max", b"\xf4\x90\x80\x80\xf5\x80"),
    ("invalid mixed", b"ok\xe2\x82\xacok\xe2\x82ok\xe2\x82\xac\x80"),
    ("invalid inside special", b"<|im_\xffend|><|im_end|>\xc3"),
]


def training_text():
    """The repo's own prose and code, plus the multilingual block and the corpus."""
    parts = []
    for pattern in ["README.md", "docs/*.md", "src/*/*.c", "src/*/*.h", "scripts/*.py"]:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read()[:40000])
    parts.append(MULTILINGUAL * 20)
    for _, t in STRESS:
        if isinstance(t, str):
            parts.append(t)
    text = "\n".join(parts)
    return [text[i:i + 2000] for i in range(0, len(text), 2000)]


def trained_bpe(pre, vocab_size, normalizer=None, limit_alphabet=None, alphabet=(), special=()):
    tok = Tokenizer(models.BPE())
    if normalizer:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=list(alphabet), special_tokens=list(special),
                                  **({"limit_alphabet": limit_alphabet} if limit_alphabet else {}))
    tok.train_from_iterator(training_text(), trainer)
    return json.loads(tok.to_str())


def added(content, id_, special, normalized=False, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def with_added(j, tokens):
    """Appends added tokens (content, special, flags...) after the vocab, as HF numbers them."""
    next_id = len(j["model"]["vocab"])
    for t in tokens:
        content, special, flags = t[0], t[1], t[2] if len(t) > 2 else {}
        j["added_tokens"].append(added(content, next_id, special, **flags))
        next_id += 1
    return j


def byte_level(regex, normalizer, ignore_merges, vocab_size, extra_vocab=()):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                            use_regex=False)])
    j = trained_bpe(pre, vocab_size, normalizer=normalizer, alphabet=pre_tokenizers.ByteLevel.alphabet())
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    j["model"]["ignore_merges"] = ignore_merges
    vocab = j["model"]["vocab"]
    for w in extra_vocab:   # whole words no merge sequence reaches: only ignore_merges finds them
        vocab.setdefault(w, len(vocab))
    return j


def sentencepiece(vocab_size):
    """A Llama-2 shaped model: <unk> <s> </s>, the 256 <0xNN> tokens, then the trained pieces."""
    pre = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    j = trained_bpe(pre, vocab_size, limit_alphabet=120, special=["<unk>", "<s>", "</s>"])
    old = j["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = 3 + b
    for tok_, _ in sorted(old.items(), key=lambda kv: kv[1]):
        vocab.setdefault(tok_, len(vocab))
    m = j["model"]
    m.update(vocab=vocab, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    j["added_tokens"] = [added(t, i, True) for i, t in enumerate(["<unk>", "<s>", "</s>"])]
    return j


def sp_llama2(base):
    j = json.loads(json.dumps(base))
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]   # the older "a b" form
    return with_added(j, [("<extra>", False, {"normalized": True}), ("<mask>", True, {"lstrip": True})])


def sp_metaspace(base):
    j = json.loads(json.dumps(base))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}]}
    return with_added(j, [("<mask>", False, {"single_word": True}), ("<|rstrip|>", True, {"rstrip": True})])


def sp_legacy(base):
    j = json.loads(json.dumps(base))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}
    j["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}
    return j


def bl_gpt2():
    pre = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    j = trained_bpe(pre, 2000, normalizer=normalizers.NFKC(), alphabet=pre_tokenizers.ByteLevel.alphabet())
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Replace", "pattern": {"Regex": " {3,}"}, "content": "  "}]}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "--"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[;|]"}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\$+"}, "behavior": "Removed", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return with_added(j, [("<|endoftext|>", True)])


def wp_suffix():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"\w+|[^\w\s]"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"\d"), behavior="contiguous")])
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, show_progress=False, limit_alphabet=80,
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>", special_tokens=["[UNK]"])
    tok.train_from_iterator(training_text(), trainer)
    j = json.loads(tok.to_str())
    j["model"]["fuse_unk"] = False
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "</w>"}, "content": " "},
        {"type": "Replace", "pattern": {"Regex": "^##"}, "content": ""},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}   # HF panics on stop > 0 and ""
    return with_added(j, [("[MASK]", True, {"lstrip": True})])


def build(out):
    qwen2 = byte_level(QWEN2, normalizers.NFC(), False, 3000)
    qwen2["normalizer"] = {"type": "NFC"}
    with_added(qwen2, [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                       ("<think>", False), ("</think>", False), ("<tool_call>", False), ("</tool_call>", False),
                       ("<|lstrip|>", True, {"lstrip": True}), ("<|rstrip|>", True, {"rstrip": True}),
                       ("<mask>", False, {"single_word": True}), ("cafe\u0301", False, {"normalized": True})])
    llama3 = byte_level(LLAMA3, None, True, 3000,
                        extra_vocab=["\u0120unreachable", "\u0120tokenization", "unreachable", "Unreachable"])
    with_added(llama3, [("<|begin_of_text|>", True), ("<|end_of_text|>", True),
                        ("<|start_header_id|>", True), ("<|end_header_id|>", True), ("<|eot_id|>", True)]
               + [("<|reserved_special_token_%d|>" % i, True) for i in range(12)])
    o200k = byte_level(O200K, None, True, 3000, extra_vocab=["\u0120unreachable"])
    with_added(o200k, [("<|start|>", True), ("<|message|>", True), ("<|end|>", True), ("<|channel|>", True),
                       ("<|return|>", True), ("<|endoftext|>", True), ("<tool_call>", False, {"rstrip": True})])
    sp = sentencepiece(2000)
    tokenizers = {"bl_qwen2": qwen2, "bl_llama3": llama3, "bl_o200k": o200k,
                  "sp_llama2": sp_llama2(sp), "sp_metaspace": sp_metaspace(sp), "sp_legacy": sp_legacy(sp),
                  "bl_gpt2": bl_gpt2(), "wp_suffix": wp_suffix()}
    for name, j in tokenizers.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        text = json.dumps(j, ensure_ascii=False, indent=None, separators=(",", ":"))
        Tokenizer.from_str(text)   # HF must load what we wrote
        with open(os.path.join(out, name, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)


def random_strings(n, seed):
    """Random mixes of the corpus's ingredients: where two regimes meet is where splitters differ."""
    rng = random.Random(seed)
    pieces = [t for _, t in STRESS if isinstance(t, str) and t and len(t) < 200] + MULTILINGUAL.split()
    atoms = list(" \t\n\r\u00a0\u3000\u0085'\"<>|_-.,:;!?0123456789") + ["<|im_end|>", "<mask>", "<s>", "'s", "\u0301"]
    out = []
    for _ in range(n):
        s = ""
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.4:
                p = rng.choice(pieces)
                a = rng.randint(0, len(p))
                s += p[a:a + rng.randint(1, 30)]
            elif r < 0.8:
                s += rng.choice(atoms) * rng.randint(1, 3)
            else:
                s += chr(rng.choice([rng.randint(0x20, 0x2FF), rng.randint(0x300, 0x36F), rng.randint(0x4E00, 0x4FFF),
                                     rng.randint(0x1F300, 0x1F6FF), rng.randint(0x600, 0x6FF)]))
        b = s.encode("utf-8")
        if rng.random() < 0.1:   # a stray byte
            k = rng.randint(0, len(b))
            b = b[:k] + bytes([rng.choice([0x80, 0xBF, 0xC3, 0xE2, 0xF0, 0xFF])]) + b[k:]
        out.append(("random", b))
    return out


def expect(out, corpus):
    entries = []
    for _, t in corpus:
        if isinstance(t, bytes):
            try:
                entries.append({"text": t.decode("utf-8")})
            except UnicodeDecodeError:
                entries.append({"hex": t.hex()})
        else:
            entries.append({"text": t})
    with open(os.path.join(out, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(entries, f, ensure_ascii=False, indent=0)
    texts = [e["text"] if "text" in e else bytes.fromhex(e["hex"]).decode("utf-8", "replace") for e in entries]
    for path in sorted(glob.glob(os.path.join(out, "*", "tokenizer.json"))):
        tok = Tokenizer.from_file(path)
        cases = []
        for text in texts:
            tok.encode_special_tokens = False
            ids = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = True
            plain = tok.encode(text, add_special_tokens=False).ids
            cases.append({"ids": ids, "ids_plain": plain,
                          "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        with open(os.path.join(os.path.dirname(path), "expected.json"), "w", encoding="utf-8") as f:
            json.dump({"hf_tokenizers": __version__, "cases": cases}, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "tokenizer"))
    ap.add_argument("--expect-only", action="store_true", help="keep the tokenizer.json files, rewrite the answers")
    ap.add_argument("--random", type=int, default=0, help="add N random strings to the corpus")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not a.expect_only:
        build(a.out)
    corpus = STRESS + (random_strings(a.random, a.seed) if a.random else [])
    expect(a.out, corpus)
    n = len(glob.glob(os.path.join(a.out, "*", "tokenizer.json")))
    print(f"{a.out}: {n} tokenizers x {len(corpus)} strings (tokenizers {__version__})", file=sys.stderr)


if __name__ == "__main__":
    main()
