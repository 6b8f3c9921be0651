"""Issue 15's done-when, through the wizard: a run with real weights from a local folder and a local JSONL chat
dataset, written and launched with `l` (2 CPU processes), trains on that data; the tokens it counts in metrics.jsonl
and the blocks its log names match what this test computes on its own from the data, with the same tokenizer
(its chat template) and the trainer's packing rule (each conversation closed by the end token, concatenated, cut
into seq_len blocks, the tail dropped). No random-init anywhere unless chosen.

The model is a tiny random Qwen2 `save_pretrained` into tmp with a byte-level BPE tokenizer trained offline on the
test's own text and wrapped as PreTrainedTokenizerFast with a chat template (transformers 5 loads it back as the
model type's tokenizer class from its vocabulary and merges, so it is byte-level BPE as Qwen2's is). The expected
count uses the tokenizer as the trainer loads it (AutoTokenizer on the folder).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import import_when_run

from scaletrain.engine.launch.status import read_status

from scaletrain.engine.run.metrics import read_metrics
from scaletrain.engine.run.plan_document import read_plan_document
from scaletrain.tui.cli.parser import parse_args
from scaletrain.tui.wizard.app import create_app
from test_wizard import no_gpu, press, retype, run, screen_name, settle, text_of

_libs = import_when_run("transformers", "tokenizers")

SEQ_LEN = 32
EFFECTIVE_BATCH = 4
WORLD = 2
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIALS = ["<pad>", "<s>", "</s>", "[UNK]"]


def conversations(n: int = 48, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
        a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        out.append({"messages": [{"role": "user", "content": f"repeat {q}"},
                                 {"role": "assistant", "content": f"{q} {a}"}]})
    return out


def tiny_model_folder(folder: Path, texts: list[str]) -> object:
    """A WordLevel tokenizer trained on `texts` and a random tiny Qwen2 sized to it, saved as a model folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="[UNK]")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    cfg = Qwen2Config(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, pad_token_id=fast.pad_token_id, bos_token_id=fast.bos_token_id,
                      eos_token_id=fast.eos_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    return fast


def expected_tokens(records: list[dict], tok) -> tuple[int, int, int]:
    """(blocks, optimizer steps in one epoch, tokens trained) computed here, not by the trainer's code."""
    total = 0
    for rec in records:
        out = tok.apply_chat_template(rec["messages"], tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        assert len(ids) > 8 and tok.unk_token_id not in ids      # the tokenizer knows every word of the data
        total += len(ids) + 1                                    # + the end token closing each conversation
    blocks = total // SEQ_LEN                                    # packing: concatenated, cut, the tail dropped
    steps = (blocks // WORLD) // (EFFECTIVE_BATCH // WORLD)      # every rank takes the same number of rows
    return blocks, steps, steps * EFFECTIVE_BATCH * SEQ_LEN


@pytest.mark.slow
def test_wizard_trains_real_weights_on_a_local_chat_dataset(tmp_path):
    records = conversations()
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    folder = tmp_path / "tiny-chat-model"
    texts = [m["content"] for r in records for m in r["messages"]] + ["<|user|> <|assistant|> <|end|>"]
    tiny_model_folder(folder, texts)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)      # as the trainer loads it
    blocks, steps, tokens = expected_tokens(records, tok)
    assert steps >= 3
    run_dir = tmp_path / "run"
    app = create_app(parse_args(["--gpus", "2xCPU", "--precision", "fp32", "--attn", "sdpa", "--strategy", "ddp",
                      "--no-grad-ckpt", "--run-dir", str(run_dir)]), detect=no_gpu)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            await retype(pilot, app, "model", str(folder))
            await press(pilot, app, "enter")
            assert app.screen.query_one("#in-weights").value == str(folder)     # the folder's own weights
            await pilot.click("#method-full")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "BatchScreen", text_of(app, "#status")
            await retype(pilot, app, "effective_batch", str(EFFECTIVE_BATCH))
            await retype(pilot, app, "seq_len", str(SEQ_LEN))
            await retype(pilot, app, "data", str(data))
            await retype(pilot, app, "lr", "1e-3")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "PlanScreen", text_of(app, "#status")
            assert app.plan.setup.dataset_size == len(records)                  # counted from the data
            await press(pilot, app, "ctrl+n")
            assert not app.screen.query_one("#weights-warning").display         # real weights: no warning
            await pilot.press("l")                                              # writes, then launches
            await pilot.pause()
            for _ in range(800):
                if app.launch_error is not None or read_status(run_dir / "status.json").over:
                    break
                await pilot.pause(0.3)
            return screen_name(app), read_status(run_dir / "status.json"), app.launch_error

    screen, result, error = run(walk())
    assert screen == "MonitorScreen"
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert error is None and result.exit_code == 0, log[-3000:]
    doc = read_plan_document(run_dir / "plan.json")
    train = json.loads((run_dir / "plan.json").read_text())["train"]
    assert train["model_source"] == str(folder.resolve()) and train["dataset"] == str(data.resolve())
    assert doc.world_size == WORLD
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m.step for m in metrics] == list(range(1, steps + 1))
    assert sum(m.tokens for m in metrics) == tokens
    assert f"{blocks} blocks × {SEQ_LEN} tokens from {data.name}" in log
    assert "random" not in log.lower() and "demo data" not in log
