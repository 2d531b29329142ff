#!/usr/bin/env python3
"""make_arith.py — the bundled toy chat data set: arithmetic word problems.

A task a tiny byte-level model learns in ~150 steps: the question varies
(addition, subtraction, small multiplication; a dozen phrasings; names,
pronouns and objects), the answer has one fixed format:

    user:      Tom has 23 apples and buys 58 more. How many apples does he have now?
    assistant: 23 + 58 = 81. The answer is 81.

Deterministic: the same --seed gives byte-identical files. The eval set holds
no question that also appears in the train set.

Usage (from the repository root; these are the defaults):
    python3 data/make_arith.py --seed 1234 --train 3000 --eval 200 --out data/arith

Writes OUT/chat_train.jsonl and OUT/chat_eval.jsonl, one
{"messages":[{"role":"user","content":...},{"role":"assistant","content":...}]}
per line. Python 3 standard library only.
"""

import argparse
import json
import os
import random
import sys

NAMES = [
    ("Tom", "he"), ("Anna", "she"), ("Ben", "he"), ("Maria", "she"), ("Sam", "he"),
    ("Lucy", "she"), ("Omar", "he"), ("Priya", "she"), ("Jack", "he"), ("Mei", "she"),
    ("Carlos", "he"), ("Emma", "she"), ("Noah", "he"), ("Zoe", "she"), ("Leo", "he"),
    ("Nina", "she"),
]
OBJECTS = [
    "apples", "pencils", "marbles", "cookies", "stickers", "books", "coins", "shells",
    "cards", "stamps", "oranges", "balloons", "cupcakes", "toy cars", "flowers", "eggs",
]
CONTAINERS = ["bags", "boxes", "baskets", "jars", "packs", "crates"]


def add_problem(rng):
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    name, he = rng.choice(NAMES)
    name2, _ = rng.choice([n for n in NAMES if n[0] != name])
    obj = rng.choice(OBJECTS)
    q = rng.choice([
        f"{name} has {a} {obj} and buys {b} more. How many {obj} does {he} have now?",
        f"{name} had {a} {obj}. Then {he} found {b} more. How many {obj} does {he} have in total?",
        f"{name} has {a} {obj}. {name2} gives {name} {b} more {obj}. How many {obj} does {name} have?",
        f"One box holds {a} {obj} and another box holds {b} {obj}. How many {obj} are there altogether?",
        f"What is {a} plus {b}?",
        f"Add {a} and {b}. What do you get?",
        f"On Monday {name} collected {a} {obj}. On Tuesday {he} collected {b} more. "
        f"How many {obj} did {he} collect over the two days?",
    ])
    return q, f"{a} + {b} = {a + b}. The answer is {a + b}."


def sub_problem(rng):
    a = rng.randint(10, 99)
    b = rng.randint(2, a - 1)
    name, he = rng.choice(NAMES)
    name2, _ = rng.choice([n for n in NAMES if n[0] != name])
    obj = rng.choice(OBJECTS)
    q = rng.choice([
        f"{name} has {a} {obj} and gives {b} to {name2}. How many {obj} does {name} have left?",
        f"There were {a} {obj} in a basket. {name} took {b} of them. How many {obj} are left?",
        f"{name} had {a} {obj} but lost {b}. How many {obj} does {he} have now?",
        f"What is {a} minus {b}?",
        f"Subtract {b} from {a}. What is the result?",
        f"A shop had {a} {obj} in the morning and sold {b} of them by noon. "
        f"How many {obj} does the shop still have?",
    ])
    return q, f"{a} - {b} = {a - b}. The answer is {a - b}."


def mul_problem(rng):
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    name, he = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    box = rng.choice(CONTAINERS)
    q = rng.choice([
        f"{name} buys {a} {box} with {b} {obj} in each. How many {obj} does {he} have?",
        f"A shelf has {a} rows with {b} {obj} in each row. How many {obj} are on the shelf?",
        f"What is {a} times {b}?",
        f"Multiply {a} by {b}. What do you get?",
        f"Each of {a} children has {b} {obj}. How many {obj} do the children have together?",
    ])
    return q, f"{a} * {b} = {a * b}. The answer is {a * b}."


KINDS = [add_problem, sub_problem, mul_problem]


def sample(rng):
    q, a = rng.choice(KINDS)(rng)
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def draw(rng, n, seen):
    """n samples whose questions are not in seen (seen is updated)."""
    out = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n:
            sys.exit("make_arith: could not draw %d distinct questions" % n)
        s = sample(rng)
        q = s["messages"][0]["content"]
        if q in seen:
            continue
        seen.add(q)
        out.append(s)
    return out


def write_jsonl(path, samples):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for s in samples:
            f.write(json.dumps(s, ensure_ascii=False, separators=(",", ":")) + "\n")


def main():
    ap = argparse.ArgumentParser(description="Generate the arithmetic chat data set.")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train", type=int, default=3000, help="train samples (default 3000)")
    ap.add_argument("--eval", type=int, default=200, help="held-out eval samples (default 200)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "arith"),
                    help="output folder (default data/arith)")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    seen = set()
    train = draw(rng, args.train, seen)
    held_out = draw(rng, args.eval, seen)

    os.makedirs(args.out, exist_ok=True)
    write_jsonl(os.path.join(args.out, "chat_train.jsonl"), train)
    write_jsonl(os.path.join(args.out, "chat_eval.jsonl"), held_out)
    print("make_arith: wrote %d train and %d eval samples to %s (seed %d)"
          % (len(train), len(held_out), args.out, args.seed))


if __name__ == "__main__":
    main()
