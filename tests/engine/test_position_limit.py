"""A model with a learned position table cannot run a longer sequence: the plan refuses it in one line.

gpt2's wpe holds n_positions rows (1024), opt's and bart's tables 2 rows more for their offset, roberta's positions
start after its padding index (514 rows hold 512). A plan for gpt2 at the default 2048 tokens once said "fits", and
the run failed at its first forward (an index past the table; on a GPU, a device-side assert). The trace records
the usable rows (`position_table`), and they are checked here against transformers' own forward: the limit runs,
one token more fails. Rotary models (llama) have no table: a longer sequence runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import import_when_run

_libs = import_when_run("torch", "transformers")

# (model_type, the config key of its positions)
TABLES = [("gpt2", "n_positions"), ("opt", "max_position_embeddings"), ("roberta", "max_position_embeddings"),
          ("bart", "max_position_embeddings"), ("marian", "max_position_embeddings"),
          ("llama", "max_position_embeddings")]
POSITIONS = 40


def _config(model_type: str, key: str) -> dict:
    from scaletrain.measure.tiny_configs import config_dict, shrink

    return {**shrink(config_dict(model_type), model_type), key: POSITIONS}


def _gpt2_folder(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_config("gpt2", "n_positions")))
    return folder


def _runs(model, tokens: int) -> bool:
    import torch

    try:
        with torch.no_grad():
            model(input_ids=torch.randint(5, 100, (1, tokens)))
    except (IndexError, RuntimeError):
        return False
    return True


@pytest.mark.long                # six tiny models built and run
@pytest.mark.parametrize("model_type,key", TABLES, ids=[t for t, _ in TABLES])
def test_the_recorded_limit_runs_and_one_token_more_does_not(model_type, key):
    from scaletrain.measure.trace_structure import structure
    from scaletrain.trainer import model as model_lib

    config = _config(model_type, key)
    limit = structure(config)["position_table"]
    model = model_lib.causal_lm_from_config(model_lib.hf_config(config)).eval()
    if model_type == "llama":
        assert limit is None and _runs(model, 2 * POSITIONS)         # rotary: past the config's positions, it runs
        return
    assert limit in (POSITIONS, POSITIONS - 2)                      # roberta: 40 rows, positions from 2
    assert _runs(model, limit) and not _runs(model, limit + 1), limit


@pytest.mark.heavy               # one trace subprocess
def test_a_plan_past_a_learned_table_is_one_line_and_one_within_it_plans(tmp_path):
    """A typed --seq-len past the table is refused in one line; one within it plans, and so does no --seq-len."""
    env = dict(os.environ, SCALETRAIN_CACHE=str(tmp_path / "cache"))
    base = [sys.executable, "-m", "scaletrain.tui.cli", "plan", "--model", str(_gpt2_folder(tmp_path)),
            "--gpus", "1xH100", "--method", "full"]
    past = subprocess.run([*base, "--seq-len", str(POSITIONS + 1)], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=600)
    assert past.returncode == 2, past.stderr
    line = past.stderr.strip().splitlines()[-1]
    assert f"learned embeddings for {POSITIONS} positions" in line and f"--seq-len {POSITIONS} or less" in line
    assert "Traceback" not in past.stderr
    within = subprocess.run([*base, "--seq-len", str(POSITIONS), "--json"], capture_output=True, text=True, env=env,
                            stdin=subprocess.DEVNULL, timeout=600)
    assert within.returncode == 0, within.stderr
    assert json.loads(within.stdout)["training"]["seq_len"] == POSITIONS
    # no --seq-len: the default 2048 comes down to the table, and the plan says why (it was refused once)
    default = subprocess.run([*base, "--json"], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                             timeout=600)
    assert default.returncode == 0, default.stderr
    doc = json.loads(default.stdout)
    assert doc["training"]["seq_len"] == POSITIONS
    assert any(f"learned embeddings for {POSITIONS} positions" in n and "comes down to it" in n
               for n in doc["notes"]), doc["notes"]


@pytest.mark.heavy               # a trace subprocess
def test_the_wizards_sequence_length_comes_down_to_the_table_and_says_so(tmp_path, monkeypatch):
    """The model step could not go on: its check planned the default 2048 tokens, which the engine refuses for
    gpt2, and the sequence length is only asked on the next step. It now comes down to the table, with a note."""
    import asyncio

    from scaletrain.tui.cli.parser import parse_args
    from scaletrain.tui.wizard.app import create_app
    from test_wizard import no_gpu, press, retype, settle

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))
    app = create_app(parse_args(["--gpus", "1xH100", "--method", "full"]), detect=no_gpu, launch=False)
    notes: list[str] = []
    shown = app.notify

    def notify(message, *args, **kwargs):    # recorded as sent: a toast expires, and an idle-priority worker can
        notes.append(str(message))           # be held past its 10 s before the test reads the screen
        return shown(message, *args, **kwargs)

    app.notify = notify

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            await retype(pilot, app, "model", str(_gpt2_folder(tmp_path)))
            await press(pilot, app, "ctrl+n")
            for _ in range(600):                 # the model's check traces gpt2 in a subprocess
                if type(app.screen).__name__ == "BatchScreen":
                    break
                await pilot.pause(0.1)
            return type(app.screen).__name__, app.screen.query_one("#in-seq_len").value

    screen, seq = asyncio.run(walk())
    assert screen == "BatchScreen" and seq == str(POSITIONS)
    assert any(f"sequence length {POSITIONS}, not 2,048" in n and "learned embeddings" in n for n in notes), notes


@pytest.mark.heavy               # a trace subprocess
def test_the_plain_wizard_asks_the_tables_length_and_plans(tmp_path):
    answers = ["", str(_gpt2_folder(tmp_path)), "", "full", "", "", "", "", "", "", "", "", "n"]
    env = dict(os.environ, SCALETRAIN_CACHE=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "--plain", "--gpus", "1xH100"],
                         input="\n".join(answers) + "\n", capture_output=True, text=True, env=env, timeout=600,)
    assert f"sequence length {POSITIONS}, not 2,048" in res.stdout, res.stdout[-3000:]
    assert f"Sequence length [{POSITIONS}]" in res.stdout and f"seq {POSITIONS}, loop trainer" in res.stdout
    assert res.returncode == 0, res.stderr[-2000:]
