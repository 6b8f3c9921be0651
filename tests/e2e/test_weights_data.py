"""Issue 15: the weights a run starts from (--weights), its data (--data) and any HF causal LM (--model ORG/NAME from
the HF cache), through the real CLI; the pilot trains a local pretrained folder on a local chat dataset on 2 CPU
processes and checks the tokens the trainer counted against the data, tokenized independently."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.engine.catalog.architectures import catalog_entry
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.launch.launcher import launch
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.engine.request.weights import RANDOM_INIT_WARNING, weights_problem, weights_warning
from scaletrain.tui.cli.main import main

from test_train_cpu import deadline_tick

TINY = ["--model", "scaletrain/tiny-qwen2", "--gpus", "2xCPU", "--precision", "fp32"]


def _json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _fails(capsys, argv: list[str], needle: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    return err


# ---- any HF causal LM, offline from a real cache layout ------------------------------------------------------------
def _hf_cache(root: Path, repo: str, config: dict, kind: str = "models", files: dict | None = None) -> Path:
    """huggingface_hub's layout: <root>/<kind>--ORG--NAME/{refs/main, snapshots/<rev>/...} (blobs as files)."""
    repo_dir = root / f"{kind}--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text("0123abcd")
    if config:
        (snap / "config.json").write_text(json.dumps(config))
    for name, text in (files or {}).items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_text(text)
    return snap


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    root = tmp_path / "hf" / "hub"
    root.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return root


def test_an_hf_model_outside_the_catalog_plans_from_the_cache_offline(offline_cache, capsys):
    cfg = dict(catalog_entry("meta-llama/Llama-3.1-70B")["config"], max_position_embeddings=131072)
    _hf_cache(offline_cache, "meta-llama/Llama-3.3-70B-Instruct", cfg)
    out = _json(capsys, "--model", "meta-llama/Llama-3.3-70B-Instruct", "--gpus", "2x8xH100")
    ref = _json(capsys, "--model", "meta-llama/Llama-3.1-70B", "--gpus", "2x8xH100")
    assert out["model"]["name"] == "meta-llama/Llama-3.3-70B-Instruct"
    assert out["model"]["params"] == ref["model"]["params"] > 70e9            # the same architecture
    assert out["weights"]["source"] == "meta-llama/Llama-3.3-70B-Instruct" and out["weights"]["warning"] is None
    assert "not in the HF cache" in out["weights"]["note"]                   # only its config.json is here
    snap = next(offline_cache.glob("models--meta-llama--Llama-3.3-70B-Instruct/snapshots/*"))
    (snap / "model.safetensors").write_bytes(b"")
    assert _json(capsys, "--model", "meta-llama/Llama-3.3-70B-Instruct", "--gpus", "2x8xH100")["weights"]["note"] is None


def test_an_hf_model_neither_cached_nor_reachable_is_one_line_with_a_did_you_mean(offline_cache, capsys):
    err = _fails(capsys, ["plan", "--model", "meta-llama/Llama-3.3-70B-Instruct", "--gpus", "8xH100"],
                 "not in the HF cache at " + str(offline_cache))
    assert "HF_HUB_OFFLINE" in err and "config.json path" in err and "did you mean meta-llama/Llama-3.1-70B?" in err


def test_a_base_model_not_here_is_pointed_at_its_catalog_variant(offline_cache, capsys):
    """Qwen/Qwen2.5-7B (the base) is not in the catalog; its Instruct variant is: the nearest id, not a model whose
    name only shares letters (it said "did you mean Qwen/Qwen3-4B?")."""
    err = _fails(capsys, ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "8xH100"], "unknown model")
    assert "did you mean Qwen/Qwen2.5-7B-Instruct?" in err


# ---- weights ------------------------------------------------------------------------------------------------------
def test_weights_default_to_the_models_own_and_random_init_is_a_red_warning(capsys):
    assert _json(capsys, "--model", "Qwen/Qwen3-4B", "--gpus", "8xRTX4090")["weights"]["source"] == "Qwen/Qwen3-4B"
    tiny = _json(capsys, *TINY)["weights"]                        # a config-only catalog model: nothing else exists
    assert tiny["source"] == "random-init" and tiny["warning"] == RANDOM_INIT_WARNING
    capsys.readouterr()
    assert main(["plan", "--model", "Qwen/Qwen3-4B", "--gpus", "8xRTX4090", "--weights", "random-init"]) == 0
    out = capsys.readouterr().out
    assert "warning: random-init weights: testing only, this trains noise" in " ".join(out.split())
    assert weights_warning("Qwen/Qwen3-4B") is None


def test_quantized_base_from_random_init_is_refused_when_written(tmp_path, capsys):
    run = tmp_path / "q"
    _fails(capsys, [*TINY, "--method", "qlora", "--weights", "random-init", "--headless", "--dry-run", "--run-dir",
                    str(run)], "needs pretrained weights")
    _fails(capsys, [*TINY, "--method", "lora", "--base-bits", "8", "--headless", "--dry-run", "--run-dir", str(run)],
           "8-bit base")
    assert not run.exists()
    assert weights_problem("qlora", None, "random-init") and weights_problem("lora", 16, "random-init") is None
    assert weights_problem("qlora", 4, "Qwen/Qwen3-4B") is None


def test_local_weights_must_hold_a_config_of_the_planned_architecture(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    cfg = dict(catalog_entry("scaletrain/tiny-qwen2")["config"])
    (other / "config.json").write_text(json.dumps(dict(cfg, hidden_size=128)))
    run = tmp_path / "r"
    _fails(capsys, [*TINY, "--weights", str(empty), "--headless", "--dry-run", "--run-dir", str(run)],
           "no config.json")
    _fails(capsys, [*TINY, "--weights", str(tmp_path / "nope"), "--headless", "--dry-run", "--run-dir", str(run)],
           "no such file or folder")
    _fails(capsys, [*TINY, "--weights", str(other), "--headless", "--dry-run", "--run-dir", str(run)],
           "hidden_size 128 ≠ 64")
    assert not run.exists()


def test_a_preset_names_weights_once(tmp_path, capsys):
    p = tmp_path / "p.yaml"
    p.write_text("description: x\nweights: random-init\nrequest: {model: scaletrain/tiny-qwen2, gpus: 2xCPU}\n"
                 "train: {model_source: Qwen/Qwen3-4B}\n")
    _fails(capsys, ["plan", "--preset", str(p)], "disagree")
    assert _json(capsys, "--preset", "cpu-tiny")["weights"]["source"] == "random-init"
    assert _json(capsys, "--preset", "h200x4-fast")["weights"]["source"] == "Qwen/Qwen2.5-7B-Instruct"


# ---- data: the size comes from the data ----------------------------------------------------------------------------
def _chat_rows(n: int) -> list[dict]:
    words = "the quick brown fox jumps over a lazy dog while cats watch".split()
    return [{"messages": [{"role": "user", "content": f"say {words[i % len(words)]} twice"},
                          {"role": "assistant", "content": " ".join([words[(i * 3) % len(words)]] * (2 + i % 4))}]}
            for i in range(n)]


@pytest.mark.long
def test_data_rows_are_the_plans_dataset_size_in_every_format(tmp_path, offline_cache, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in _chat_rows(37)) + "\n")
    pq.write_table(pa.table({"prompt": ["a"] * 53, "completion": ["b"] * 53}), tmp_path / "pc.parquet")
    with (tmp_path / "t.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["text"], *([["a, b\nc"]] * 11)])
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in (1, 2):
        (folder / f"train-{i}.jsonl").write_text("".join(json.dumps({"text": "x"}) + "\n" for _ in range(5 * i)))
    _hf_cache(offline_cache, "acme/chat", {}, kind="datasets",
              files={"data/train.jsonl": "".join(json.dumps({"text": "y"}) + "\n" for _ in range(29)),
                     "data/test.jsonl": json.dumps({"text": "z"}) + "\n"})
    for spec, rows in ((jsonl, 37), (tmp_path / "pc.parquet", 53), (tmp_path / "t.csv", 11), (folder, 15),
                       ("acme/chat", 29)):
        # shorter than one 2048-token block: packed, the trainer refuses it, and so does the plan (issue 29)
        _fails(capsys, ["plan", *TINY, "--data", str(spec)], "yields no training block of 2048 tokens")
        # padded, one block per record: the bundled trainer shards rows per rank and drops a last partial step
        out = _json(capsys, "--preset", "cpu-tiny", *TINY, "--set", "train.packing=false", "--data", str(spec),
                    "--effective-batch", "2", "--micro-batch", "1", "--grad-accum", "1", "--epochs", "1")
        assert out["data"]["rows"] == rows and out["time"]["total_steps"] == rows // 2, spec
    out = _json(capsys, *TINY, "--data", str(jsonl), "--dataset-size", "1000", "--effective-batch", "2")
    assert out["time"]["total_steps"] == 500                      # --dataset-size overrides the count
    _fails(capsys, ["plan", *TINY, "--data", "acme/missing"], "not in the HF cache at")
    _fails(capsys, ["plan", *TINY, "--data", str(tmp_path / "x.txt")], "does not exist")


@pytest.mark.long
def test_plan_with_data_imports_no_torch(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "a"}) + "\n")
    code = ("import sys; from scaletrain.tui.cli.main import main; "
            f"rc = main(['plan', '--model', 'Qwen/Qwen3-4B', '--gpus', '8xH100', '--data', {str(data)!r}, '--json']);"
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH', rc, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stderr.strip().splitlines()[-1] == "NOTORCH 0", r.stderr[-2000:]


# ---- the pilot: a local pretrained folder on a local chat dataset --------------------------------------------------
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"


def _pretrained_folder(folder: Path, texts: list[str]) -> object:
    """A real tokenizer trained here (byte-level BPE as Qwen2's, a chat template, an end token) and a tiny Qwen2
    saved beside it; returns the tokenizer as built (not as reloaded), for an independent count."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<unk>", "<pad>", "<eos>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    tok.chat_template = CHAT_TEMPLATE
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return tok


@pytest.mark.slow
def test_pilot_local_weights_and_chat_data_train_on_exactly_the_datas_tokens(tmp_path, capsys):
    rows = _chat_rows(12)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    weights = tmp_path / "my-model"
    tok = _pretrained_folder(weights, [m["content"] for r in rows for m in r["messages"]])

    def n_tokens(msgs: list[dict]) -> int:          # the template's tokens + the end token the trainer closes with
        out = tok.apply_chat_template(msgs, tokenize=True)
        return len(out["input_ids"] if hasattr(out, "keys") else out) + 1
    expected = sum(n_tokens(r["messages"]) for r in rows)
    assert all(n_tokens(r["messages"]) < 64 for r in rows)        # no truncation: every token is a trained row's
    text = tok.decode(tok.apply_chat_template(rows[0]["messages"], tokenize=True)["input_ids"])
    assert text.split() == ["<|user|>", *rows[0]["messages"][0]["content"].split(), "<|end|>", "<|assistant|>",
                            *rows[0]["messages"][1]["content"].split(), "<|end|>"]     # real words, real template

    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["--preset", "cpu-tiny", "--model", str(weights), "--data", str(data), "--micro-batch", "1",
                 "--grad-accum", "1", "--seq-len", "64", "--set", "train.packing=false", "--set",
                 "train.max_steps=null", "--set", "train.save_checkpoints=false", "--headless", "--dry-run",
                 "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "random-init" not in out                                # the folder's own weights, no warning
    doc = json.loads((run / "plan.json").read_text())
    assert doc["train"]["model_source"] == str(weights) and doc["train"]["dataset"] == str(data)
    assert doc["request"]["dataset_size"] == 12 and doc["time"]["total_steps"] == 6

    result = launch(run, on_tick=deadline_tick())
    log = (run / "logs" / "rank-0.log").read_text()
    assert result.ok, log[-3000:]
    series = read_metrics(run / "metrics.jsonl")
    assert [s.step for s in series] == list(range(1, 7))
    assert sum(s.tokens for s in series) == expected               # one epoch over every record, padded
    assert f"(12 records, {expected:,} tokens)" in log and "chat.jsonl" in log
    assert "frozen" not in log and "trainable float32" in log      # full fine-tuning of the loaded weights


# ---- scaletrain models at 80 columns -------------------------------------------------------------------------------
def test_models_listing_keeps_every_id_whole_at_80_columns():
    from scaletrain.engine.catalog.architectures import catalog_ids

    env = dict(os.environ, COLUMNS="80", LINES="24", PYTHONPATH=str(Path(__file__).parents[2] / "src"))
    r = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "models"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80 and "…" not in r.stdout
    for mid in catalog_ids():
        assert any(ln.split()[:1] == [mid] for ln in lines), mid
    # every row on one line, every number whole: vocab 151936 was folded into 15193 and 6 on the next line
    rows = [ln.split() for ln in lines if ln.split()[:1] and ln.split()[0] in catalog_ids()]
    assert len(rows) == len(lines) - 3 and all(len(r) == 7 and r[5].isdigit() for r in rows), r.stdout


def test_the_trainer_reads_every_format_through_datasets(tmp_path, offline_cache):
    """The records the trainer tokenizes, from Parquet, CSV, a folder and a cached HF dataset id (offline);
    prompt+completion (TRL's naming) trains on the completion only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from scaletrain.trainer import data as D

    pq.write_table(pa.table({"prompt": ["p1", "p2"], "completion": ["c1", "c2"]}), tmp_path / "pc.parquet")
    with (tmp_path / "t.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["text"], ["a, b"], ["c"]])
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.json").write_text(json.dumps([{"text": "x"}, {"text": "y"}, {"text": "z"}]))
    _hf_cache(offline_cache, "acme/pc", {}, kind="datasets",
              files={"train.parquet": ""})
    pq.write_table(pa.table({"prompt": ["q"], "response": ["r"]}),
                   next(offline_cache.glob("datasets--acme--pc/snapshots/*")) / "train.parquet")
    assert D.read_records(tmp_path / "pc.parquet") == [{"prompt": "p1", "completion": "c1"},
                                                       {"prompt": "p2", "completion": "c2"}]
    assert [r["text"] for r in D.read_records(tmp_path / "t.csv")] == ["a, b", "c"]
    assert [r["text"] for r in D.read_records(folder)] == ["x", "y", "z"]
    assert D.read_records("acme/pc") == [{"prompt": "q", "response": "r"}]
    tok = D.ByteTokenizer(300)
    s = D.tokenize_record({"prompt": "ab", "completion": "cd"}, tok)
    assert s.input_ids == (*tok.encode("ab\n"), *tok.encode("cd"), tok.eos_id)
    assert s.labels == (D.IGNORE_INDEX,) * 3 + (*tok.encode("cd"), tok.eos_id)
    bad = tmp_path / "bad.csv"
    bad.write_text("question\nwhat\n")
    with pytest.raises(ScaletrainError, match="no usable fields"):
        D.read_records(bad)


def test_row_counts_follow_edits_to_the_file(tmp_path):
    """count_rows is cached for the wizard's per-keystroke re-parse; an edited file is counted again."""
    from scaletrain.engine.request.data_source import resolve_data

    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "a"}\n{"text": "b"}\n')
    assert resolve_data(str(f)).rows == 2
    with f.open("a") as out:
        out.write('{"text": "c"}\n')
    assert resolve_data(str(f)).rows == 3
