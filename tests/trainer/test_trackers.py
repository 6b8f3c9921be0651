"""Issue 22 (trackers): --report-to tensorboard,wandb,none. A short real run reporting to W&B writes an offline W&B
run (no network here) whose config is the plan: predicted memory and time beside the measured steps."""

from __future__ import annotations

import pytest

from scaletrain.tui.cli.main import main


@pytest.mark.parametrize("value", ["bogus", "none,wandb", ","])
def test_report_to_refuses_unknown_trackers_in_one_line(value, capsys):
    assert main(["plan", "--preset", "cpu-tiny", "--report-to", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "report_to" in err and "tensorboard, wandb" in err


def _offline_run(path) -> tuple[dict, int]:
    """(config, history records) of an offline W&B run file: a LevelDB-style log (7-byte ":W&B" header, 32 KiB
    blocks of crc/length/type-framed chunks) of wandb's own protobuf Records, read with its own message classes."""
    import json
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, chunks, recs = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind == 1:
            recs.append(chunk)
        elif kind in (2, 3):
            chunks = (chunks if kind == 3 else b"") + chunk
        elif kind == 4:
            recs.append(chunks + chunk)
    config, history = {}, 0
    for raw in recs:
        r = pb.Record()
        r.ParseFromString(raw)
        kind = r.WhichOneof("record_type")
        if kind == "run":
            config.update({u.key: json.loads(u.value_json) for u in r.run.config.update})
        elif kind == "history":
            history += 1
    return config, history


@pytest.mark.slow
def test_a_run_reporting_to_wandb_writes_an_offline_run_with_the_plan_as_config(options_run):
    """The shared `options_run` (tests/conftest.py): 12 steps of cpu-tiny reporting to W&B only, with no WANDB_API_KEY
    or WANDB_MODE in its environment; its eval loss goes into the same step's history record."""
    pytest.importorskip("wandb", reason="wandb is the optional `wandb` extra")
    from scaletrain.engine.run.metrics import read_metrics
    from scaletrain.engine.run.plan_document import read_plan_document

    run = options_run.ok()
    runs = list((run.path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    config, steps = _offline_run(next(runs[0].glob("run-*.wandb")))
    doc = read_plan_document(run.plan)
    assert config["memory"]["per_gpu_bytes"]["total"] == doc.predicted_total_bytes
    assert config["time"]["step_seconds"] == doc.planned_step_seconds
    assert [r.step for r in read_metrics(run.metrics)] == list(range(1, 13))
    assert steps == 12                                            # one history record per step
    assert not (run.path / "tensorboard").exists()               # only what was asked for
