"""Generate presets/data/demo.jsonl: small, offline, synthetic instruction data for the cpu-tiny demo and tests.

Short question/answer pairs with learnable structure (arithmetic, string edits, a fixed fact table), so a tiny
random-init model's loss visibly falls within a minute. All three record shapes the trainer accepts appear
(`text`, `prompt`/`response`, chat `messages`). Deterministic: the same seed writes the same bytes, and a test
checks the committed file against this script.

    python -m scaletrain.presets.make_demo_data [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 20240601          # fixed so the committed file is reproducible
N_SAMPLES = 1000         # ~95 KB: ~500 blocks of 128 tokens, ~30 cpu-tiny optimizer steps per epoch
DEFAULT_OUT = Path(__file__).parent / "data" / "demo.jsonl"

WORDS = ("apple", "river", "planet", "garden", "window", "silver", "rocket", "pencil", "forest", "button",
         "candle", "mirror", "harbor", "tunnel", "meadow", "violet", "copper", "lantern", "pepper", "summit")
CAPITALS = (("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Egypt", "Cairo"),
            ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"), ("Chile", "Santiago"))
ANIMALS = (("cow", "moo"), ("dog", "woof"), ("cat", "meow"), ("duck", "quack"), ("sheep", "baa"),
           ("owl", "hoot"), ("frog", "croak"), ("lion", "roar"))


def question_answer(rng: random.Random) -> tuple[str, str]:
    """One seeded toy task: (question, answer)."""
    kind = rng.randrange(7)
    if kind == 0:
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."
    if kind == 1:
        w = rng.choice(WORDS)
        return f"Reverse the word '{w}'.", f"'{w}' reversed is '{w[::-1]}'."
    if kind == 2:
        w = f"{rng.choice(WORDS)} {rng.choice(WORDS)}"
        return f"Write '{w}' in capital letters.", w.upper()
    if kind == 3:
        w = rng.choice(WORDS)
        return f"How many letters are in '{w}'?", f"'{w}' has {len(w)} letters."
    if kind == 4:
        country, city = rng.choice(CAPITALS)
        return f"What is the capital of {country}?", f"The capital of {country} is {city}."
    if kind == 5:
        animal, sound = rng.choice(ANIMALS)
        return f"What sound does a {animal} make?", f"A {animal} says {sound}."
    start, step = rng.randrange(1, 20), rng.randrange(2, 6)
    seq = [start + i * step for i in range(7)]
    return (f"Continue the sequence: {', '.join(map(str, seq[:4]))}",
            f"{', '.join(map(str, seq[4:]))}")


def make_records(n: int = N_SAMPLES, seed: int = SEED) -> list[dict]:
    """n records, rotating through the three shapes the trainer reads."""
    rng = random.Random(seed)
    out: list[dict] = []
    for i in range(n):
        q, a = question_answer(rng)
        shape = i % 3
        if shape == 0:
            out.append({"text": f"Question: {q}\nAnswer: {a}"})
        elif shape == 1:
            out.append({"prompt": q, "response": a})
        else:
            out.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
    return out


def render(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=True, separators=(",", ":")) + "\n" for r in records)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(make_records()))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {N_SAMPLES} records)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
