"""Generate presets/data/preference.jsonl and presets/data/prompts.jsonl: the tiny bundled sets the reward, DPO and
GRPO presets and tests train on (offline, synthetic, deterministic; a test checks the committed files).

preference.jsonl: {"prompt", "chosen", "rejected"} — the demo tasks' right answer against a wrong one (an
off-by-some sum, a misspelt reversal, a wrong capital …), TRL's explicit-prompt preference format.
prompts.jsonl: {"prompt", "answer"} — the same questions for GRPO; the bundled reward scores a completion by the
answer's characters it contains (trainer/objective_run.py answer_overlap).

    python -m scaletrain.presets.make_objective_data [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from scaletrain.presets.make_demo_data import question_answer

SEED = 20261201
N_PAIRS = 256
N_PROMPTS = 256
DEFAULT_DIR = Path(__file__).parent / "data"


def _wrong(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: one character or digit changed, or the words shuffled."""
    chars = list(answer)
    positions = [i for i, c in enumerate(chars) if c.isalnum()]
    if not positions:
        return answer + " (not sure)"
    i = rng.choice(positions)
    c = chars[i]
    if c.isdigit():
        chars[i] = str((int(c) + rng.randrange(1, 9)) % 10)
    else:
        chars[i] = rng.choice([x for x in "abcdefghijklmnopqrstuvwxyz" if x != c.lower()])
    return "".join(chars)


def preference_records(n: int = N_PAIRS, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        q, a = question_answer(rng)
        out.append({"prompt": f"Question: {q}\nAnswer: ", "chosen": a, "rejected": _wrong(a, rng)})
    return out


def prompt_records(n: int = N_PROMPTS, seed: int = SEED + 1) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": f"Question: {q}\nAnswer: ", "answer": a} for q, a in (question_answer(rng) for _ in range(n))]


def render(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=True, separators=(",", ":")) + "\n" for r in records)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=DEFAULT_DIR)
    args = p.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, records in (("preference.jsonl", preference_records()), ("prompts.jsonl", prompt_records())):
        path = args.out_dir / name
        path.write_text(render(records))
        print(f"wrote {path} ({path.stat().st_size} bytes, {len(records)} records)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
