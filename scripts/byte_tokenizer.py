"""byte_tokenizer.py — the byte-level tokenizer and chat template of the tiny models.

Vocabulary (vocab_size 384, configs/models/tiny):
    0-255    the bytes of the UTF-8 text
    256      <|endoftext|>   (bos; ends a plain-text document)
    257      <|im_start|>
    258      <|im_end|>      (eos; ends every chat turn)
    259      <|pad|>
    260-383  unused (never produced)

Chat template (ChatML-like, no BOS), for each message:
    <|im_start|> + role + "\n" + content + <|im_end|> + "\n"
where "\n" is the byte 10.

Assistant-only loss mask (the HF `{% generation %}` convention of
transformers' return_assistant_tokens_mask):
1 exactly on the assistant content bytes and on its <|im_end|>; 0 on the role
header "<|im_start|>assistant\n", on the "\n" after <|im_end|>, and on every
token of other roles.

Special tokens appear only where the template puts them: encode() never turns
the text "<|im_end|>" into token 258, so user text cannot forge a turn boundary.
Standard library only.
"""

ENDOFTEXT = 256
IM_START = 257
IM_END = 258
PAD = 259
VOCAB_SIZE = 384

BOS = ENDOFTEXT
EOS = IM_END

SPECIAL_NAMES = {
    ENDOFTEXT: "<|endoftext|>",
    IM_START: "<|im_start|>",
    IM_END: "<|im_end|>",
    PAD: "<|pad|>",
}

NEWLINE = 10


def encode(text):
    """Returns the UTF-8 bytes of text as a list of ids 0-255."""
    return list(text.encode("utf-8"))


def decode(ids):
    """Returns the text of ids; special tokens are rendered by name, unused ids
    (260-383) as <|unused_N|>, and invalid UTF-8 as U+FFFD."""
    out = []
    run = bytearray()
    for i in ids:
        if 0 <= i < 256:
            run.append(i)
            continue
        if run:
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
        if i in SPECIAL_NAMES:
            out.append(SPECIAL_NAMES[i])
        elif 256 <= i < VOCAB_SIZE:
            out.append("<|unused_%d|>" % i)
        else:
            raise ValueError("token id %d is outside the vocabulary (0..%d)" % (i, VOCAB_SIZE - 1))
    if run:
        out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


def encode_chat(messages):
    """Applies the chat template to messages (a list of {"role", "content"}).
    Returns (ids, mask): mask[j] is 1 where token j is trained on (assistant
    content and its <|im_end|>), else 0."""
    ids = []
    mask = []
    for m in messages:
        header = [IM_START] + encode(m["role"]) + [NEWLINE]
        ids += header
        mask += [0] * len(header)
        body = encode(m["content"]) + [IM_END]
        ids += body
        mask += [1 if m["role"] == "assistant" else 0] * len(body)
        ids.append(NEWLINE)
        mask.append(0)
    return ids, mask


def encode_text(text):
    """A plain-text document: its bytes followed by <|endoftext|>."""
    return encode(text) + [ENDOFTEXT]
