"""Issue 22 (eval): an eval split (--eval-data, or eval_fraction of the data) evaluated every eval_every steps and at
the end: eval loss and perplexity in metrics.jsonl, beside the training loss in the monitor's chart and in the
headless lines; the plan counts the eval passes."""

from __future__ import annotations

import io
import json
import math

import pytest

from scaletrain.tui.cli.main import main


@pytest.mark.slow
def test_a_run_with_eval_data_logs_eval_loss_and_the_monitor_charts_it(options_run):
    """The shared `options_run` (tests/conftest.py): cpu-tiny with --eval-data, 12 steps, eval_every 6."""
    from scaletrain.engine.run.metrics import read_metrics
    from scaletrain.engine.sampling.sampler import Sampler
    from scaletrain.engine.sampling.watcher import RunWatcher
    from scaletrain.tui.cli.monitor import stream_run

    run = options_run.ok().path
    doc = json.loads((run / "plan.json").read_text())
    assert doc["eval"]["evaluations"] == 2 and doc["eval"]["seconds"] > 0
    series = read_metrics(run / "metrics.jsonl")
    evals = [(r.step, r.eval_loss) for r in series if r.eval_loss is not None]
    assert [s for s, _ in evals] == [6, 12] and all(math.isfinite(v) and v > 0 for _, v in evals)
    assert series[-1].eval_perplexity == pytest.approx(math.exp(series[-1].eval_loss))
    w = RunWatcher(run)
    snap = w.poll()
    assert snap.series.eval_steps == (6, 12) and snap.series.eval_loss == tuple(v for _, v in evals)
    out = io.StringIO()
    stream_run(Sampler(None, None, RunWatcher(run), 3600), out, once=True)
    assert f"eval loss {series[-1].eval_loss:.4f}" in out.getvalue()


def test_eval_options_are_refused_in_one_line(capsys, tmp_path):
    base = ["plan", "--preset", "cpu-tiny"]
    for extra, word in ((["--eval-fraction", "0.7"], "eval_fraction"),
                        (["--set", "train.eval_every=0"], "eval_every"),
                        (["--eval-fraction", "0.1", "--eval-data", str(tmp_path)], "not both")):
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and word in err, err
