"""Issue 29, build 2: one validation path. Every malformed-data kind the issue lists is refused by `plan`, `--dry-run`
and `--plain` with the trainer's own line (trainer/data.py and the objectives read through
engine/request/records.py, the planner's reader too), exit 2, nothing written; `--eval-data` is checked wherever
`--data` is; a valid CSV with a field over 128 KiB is accepted by the planner and the trainer alike."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.cli.main import ERROR_PREFIX, MAX_ERROR_CHARS, main, one_line

TINY = "scaletrain/tiny-qwen2"
GOOD = '{"text": "a good record"}\n'


def _jsonl(*recs: object) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in recs).encode()


def _parquet(path: Path, columns: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


# (id, file name, content or a writer, --data-columns, the objective, a word of the trainer's line)
KINDS = [
    ("jsonl_malformed_line", "d.jsonl", b'{"text": "a"}\n{"text": oops\n', None, "sft", "not valid JSON"),
    ("jsonl_line_is_array", "d.jsonl", b'{"text": "a"}\n[1, 2]\n', None, "sft", "a JSON object is needed"),
    ("jsonl_line_is_number", "d.jsonl", b"42\n", None, "sft", "a JSON object is needed"),
    ("nul_bytes", "d.jsonl", b'{"text": "a"}\n\x00\x00\x00\x00\n', None, "sft", "NUL bytes"),
    ("deep_nesting", "d.jsonl", b'{"text": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", None, "sft",
     "nested"),
    ("moderately_deep_nesting", "d.jsonl", b'{"text": "a", "x": ' + b"[" * 200 + b"]" * 200 + b"}\n", None, "sft",
     "nested more than"),
    ("json_object_not_records", "d.json", json.dumps({"data": [{"text": "a"}]}, indent=2).encode(), None, "sft",
     "one JSON object, not records"),
    ("json_number_array", "d.json", b"[1, 2, 3]", None, "sft", "a JSON object is needed"),
    ("csv_broken_quote", "d.csv", b'text\n"an unterminated quote\nmore\n', None, "sft", "not valid CSV"),
    ("csv_no_usable_column", "d.csv", b"title,body\nx,y\n", None, "sft", "no usable fields"),
    ("csv_numeric_text_column", "d.csv", b"text\n1\n2\n", None, "sft", '"text" is 1'),
    ("parquet_no_usable_column", "d.parquet", {"title": ["x", "y"]}, None, "sft", "no usable fields"),
    ("parquet_int_text_column", "d.parquet", {"text": [1, 2]}, None, "sft", '"text" is 1'),
    ("unknown_chat_role", "d.jsonl", _jsonl({"messages": [{"role": "robot", "content": "x"}]}), None, "sft",
     "messages[0] must be"),
    ("empty_messages", "d.jsonl", _jsonl({"messages": []}), None, "sft", '"messages" is []'),
    ("null_completion", "d.jsonl", _jsonl({"prompt": "q", "completion": None}), None, "sft",
     '"completion" is null'),
    ("preference_pairs_for_sft", "d.jsonl", _jsonl({"prompt": "q", "chosen": "a", "rejected": "b"}), None, "sft",
     "preference pair"),
    ("data_columns_missing_column", "d.jsonl", _jsonl({"question": "q", "answer": "a"}),
     "prompt=question,completion=reply", "sft", "which the data lacks"),
    ("data_columns_wrong_shape", "d.jsonl", _jsonl({"question": "q"}), "messages=question", "sft",
     '"messages" is "q"'),
    ("not_utf8", "d.jsonl", b'{"text": "\xff\xfe"}\n', None, "sft", "not UTF-8"),
    ("dpo_rows_without_rejected", "d.jsonl", _jsonl({"prompt": "q", "chosen": "a"}), None, "dpo", "lacks rejected"),
    ("dpo_null_chosen", "d.jsonl", _jsonl({"prompt": "q", "chosen": None, "rejected": "b"}), None, "dpo",
     "'chosen' is null"),
]


def _write(tmp: Path, name: str, content: object) -> Path:
    p = tmp / "data" / name
    p.parent.mkdir(exist_ok=True)
    if isinstance(content, dict):
        _parquet(p, content)
    else:
        p.write_bytes(content)
    return p


def _trainer_line(path: Path, columns: str | None, objective: str) -> str:
    """What the trainer raises for this file (its own reader: trainer/data.py, trainer/objective_run.py)."""
    from scaletrain.engine.request.fields import parse_columns
    from scaletrain.trainer.data import read_records
    from scaletrain.trainer.objective_run import read_rows

    with pytest.raises(ScaletrainError) as e:
        if objective == "sft":
            read_records(path, parse_columns(columns) if columns else None)
        else:
            read_rows(path, objective)
    return ERROR_PREFIX + one_line(str(e.value), MAX_ERROR_CHARS - len(ERROR_PREFIX))


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def _front_ends(path: Path, columns: str | None, objective: str, run_dir: Path, eval_only: Path | None) -> dict:
    data = ["--data", str(eval_only)] + ["--eval-data", str(path)] if eval_only else ["--data", str(path)]
    extra = data + (["--data-columns", columns] if columns else []) + ["--objective", objective]
    model = ["--model", TINY, "--weights", "random-init", "--gpus", "2xCPU", "--precision", "fp32"]
    return {"plan": ["plan", *model, *extra],
            "dry_run": ["--preset", "cpu-tiny", *extra, "--headless", "--dry-run", "--run-dir", str(run_dir)],
            "plain": ["--plain", "--preset", "cpu-tiny", *extra, "--run-dir", str(run_dir)]}


@pytest.mark.parametrize("kind,name,content,columns,objective,needle", KINDS, ids=[k[0] for k in KINDS])
def test_malformed_data_is_refused_by_plan_dry_run_and_plain_with_the_trainers_line(
        kind, name, content, columns, objective, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SCALETRAIN_DEBUG", "1")
    path = _write(tmp_path, name, content)
    expected = _trainer_line(path, columns, objective)
    assert needle in expected, expected
    good = tmp_path / "good.jsonl"
    good.write_text(GOOD if objective == "sft" else json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n")
    before = _tree(tmp_path)
    for as_eval in (False, True):
        if as_eval and (objective != "sft" or columns):      # the good --data would lack the mapped columns
            continue
        for front, argv in _front_ends(path, columns, objective, tmp_path / "run", good if as_eval else None).items():
            capsys.readouterr()
            code = main(argv)
            out, err = capsys.readouterr()
            where = f"{front}{' --eval-data' if as_eval else ''}"
            assert code == 2, (where, code, err[-500:])
            assert err.strip("\n").split("\n") == [expected], (where, err[-800:], expected)
            assert len(err.strip()) <= 500
            assert _tree(tmp_path) == before, where
            assert not (tmp_path / "run").exists()


def test_the_plain_data_question_refuses_a_malformed_file_with_the_trainers_line_and_asks_again(tmp_path):
    from scaletrain.tui.cli.parser import build_parser
    from scaletrain.tui.wizard.plain import ask_batch
    from scaletrain.tui.wizard.state import state_from_args

    bad = _write(tmp_path, "d.jsonl", b'{"text": "a"}\n[1]\n')
    expected = _trainer_line(bad, None, "sft")

    class Scripted:                      # the plain wizard's asker, answering the dataset question twice
        refusals: list[str] = []

        def text(self, prompt, default, parse, completions=()):
            if prompt.startswith("Dataset"):
                with pytest.raises(ScaletrainError) as e:
                    parse(str(bad))
                self.refusals.append(ERROR_PREFIX + one_line(str(e.value), MAX_ERROR_CHARS - len(ERROR_PREFIX)))
                return parse("1000")
            return parse(default or "16")

    state = state_from_args(build_parser().parse_args(["--plain", "--preset", "cpu-tiny"]))
    asker = Scripted()
    state = ask_batch(asker, state, None)
    assert asker.refusals == [expected]
    assert state.request.dataset_size == 1000 and state.train.dataset is None


def test_a_valid_csv_with_a_field_over_128_kib_is_accepted(tmp_path, capsys):
    from scaletrain.trainer.data import read_records

    big = "word " * 40_000                                       # 200 KB in one field
    p = tmp_path / "big.csv"
    p.write_text("prompt,completion\n" + f'"{big}",short answer\n' + 'q,"a, with a comma"\n')
    recs = read_records(p)
    assert len(recs) == 2 and recs[0]["prompt"] == big and recs[1]["completion"] == "a, with a comma"
    assert main(["plan", "--model", TINY, "--weights", "random-init", "--gpus", "2xCPU", "--dataset-size", "10",
                 "--data", str(p), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["spec"].endswith("big.csv")


@pytest.mark.parametrize("kind", ["jsonl_line_is_array", "preference_pairs_for_sft", "csv_broken_quote"])
def test_the_wizard_refuses_malformed_data_at_its_field_and_at_the_write_step(kind, tmp_path):
    """The Textual wizard's batch form (the field shows the trainer's line) and its write step (preview and write,
    for data that reached the state another way: a preset, --data): the same line, nothing written."""
    from scaletrain.tui.cli.parser import build_parser
    from scaletrain.tui.wizard import run_files
    from scaletrain.tui.wizard.state import FieldError, apply_batch_fields, plan_for, state_from_args

    _, name, content, columns, objective, _needle = next(k for k in KINDS if k[0] == kind)
    path = _write(tmp_path, name, content)
    expected = _trainer_line(path, columns, objective)
    state = state_from_args(build_parser().parse_args(["--preset", "cpu-tiny"]))
    values = {"effective_batch": "16", "seq_len": "64", "data": str(path), "dataset": "", "epochs": "1",
              "lr": "1e-4", "base_lr": "", "base_batch": ""}
    with pytest.raises(FieldError) as e:
        apply_batch_fields(state, values)
    assert e.value.field_name == "data" and ERROR_PREFIX + one_line(str(e.value), MAX_ERROR_CHARS - len(ERROR_PREFIX)) == expected
    state = state.with_train(dataset=str(path))
    plan = plan_for(state, None)
    for attempt in (lambda: run_files.preview(plan, state, str(tmp_path / "run")),
                    lambda: run_files.write(plan, state, str(tmp_path / "run"))):
        with pytest.raises(ScaletrainError) as e:
            attempt()
        assert ERROR_PREFIX + one_line(str(e.value), MAX_ERROR_CHARS - len(ERROR_PREFIX)) == expected
    assert not (tmp_path / "run").exists()


def test_data_shorter_than_one_block_is_the_trainers_refusal_at_plan_time(tmp_path, capsys):
    """The profile's blocks are the trainer's: none at this --seq-len is its refusal, by plan and --dry-run alike."""
    from scaletrain.trainer.data import ByteTokenizer, load_blocks

    p = tmp_path / "short.jsonl"
    p.write_text('{"text": "tiny"}\n')
    with pytest.raises(ScaletrainError) as e:
        load_blocks(p, ByteTokenizer(1024), 512, packing=True)
    expected = ERROR_PREFIX + one_line(str(e.value), MAX_ERROR_CHARS - len(ERROR_PREFIX))
    for argv in (["plan", "--model", TINY, "--weights", "random-init", "--gpus", "2xCPU", "--seq-len", "512"],
                 ["--preset", "cpu-tiny", "--seq-len", "512", "--headless", "--dry-run", "--run-dir",
                  str(tmp_path / "run")]):
        capsys.readouterr()
        assert main([*argv, "--data", str(p)]) == 2
        assert capsys.readouterr().err.strip() == expected
    assert not (tmp_path / "run").exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.long
def test_a_tokenizer_missing_on_this_machine_stays_a_note(tmp_path, monkeypatch, capsys):
    """HF weights not in this machine's (empty) cache: no tokenizer to count with. The records are still checked;
    the plan counts rows, says why there are no token statistics, and exits 0."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache" / "traces"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")   # a hub that refuses: no DNS needed
    for var in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    data = tmp_path / "d.jsonl"
    data.write_text(GOOD * 3)
    code = main(["plan", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--gpus", "1xH100", "--data", str(data), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    prof = json.loads(out.out)["data"]["profile"]
    assert prof["no_tokenizer"] and "no token statistics" in prof["note"] and prof["records"] == 3
    # said without huggingface_hub's five retries, and not remembered: once the hub answers, the same plan counts
    assert "not in this machine's HF cache and the hub is " in prof["note"], prof["note"]   # unreachable, or off
    assert not list((tmp_path / "cache").rglob("*.json"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD + "[1]\n")
    assert main(["plan", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--gpus", "1xH100", "--data", str(bad)]) == 2
    assert "a JSON object is needed" in capsys.readouterr().err
