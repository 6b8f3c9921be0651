"""What a run costs: the bundled, dated price table, the user's prices.yaml over it, --gpu-price, the plan's cost
in `plan --json` and its text, and `--table gpus` with a cost per row ranked by time or by cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.engine.catalog.hardware import GPU_CATALOG
from scaletrain.engine.plan.cost import BUNDLED_PRICES, bundled_prices, price_table, read_user_prices
from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.cli.main import main

PRESET = "4090x16-bs256"          # 16 RTX 4090s, with a dataset size: a total time


def _plan(capsys, *args, code=0) -> dict:
    assert main(["plan", *args, "--json"]) == code
    return json.loads(capsys.readouterr().out)


def test_every_catalog_gpu_has_a_dated_sourced_price():
    table = bundled_prices()
    assert {g.key for g in GPU_CATALOG} == set(table.prices)
    for key, price in table.prices.items():
        assert price.currency == "USD" and 0 < price.per_gpu_hour < 100, key
        assert "as known on 2025-06-30" in price.source and "on-demand" in price.source, key
    text = BUNDLED_PRICES.read_text()
    assert "as known on" in text and "not fetched" in text      # the file says where and when


def test_plan_json_has_the_cost_of_its_gpus_over_its_time(capsys):
    out = _plan(capsys, "--preset", PRESET)
    cost = out["cost"]
    price = bundled_prices().price("RTX4090")
    assert cost["currency"] == "USD" and cost["price_source"] == price.source
    assert cost["gpus"] == out["hardware"]["world_size"] == 16
    assert cost["per_hour"] == pytest.approx(price.per_gpu_hour * 16)
    assert cost["hours"] == pytest.approx(out["time"]["total_seconds"] / 3600)
    assert cost["total"] == pytest.approx(cost["per_hour"] * out["time"]["total_seconds"] / 3600)
    assert cost["per_step"] == pytest.approx(cost["per_hour"] * out["time"]["step_seconds"] / 3600)


def test_gpu_price_overrides_and_without_a_dataset_size_the_total_is_unknown(capsys):
    out = _plan(capsys, "--model", "Qwen/Qwen3-4B", "--gpus", "8xH100", "--gpu-price", "2.10")
    cost = out["cost"]
    assert cost["price_source"] == "--gpu-price" and cost["per_hour"] == pytest.approx(16.8)
    assert cost["total"] is None and cost["hours"] is None and cost["per_step"] > 0


def test_the_cpu_device_has_no_price_unless_given(capsys):
    cost = _plan(capsys, "--preset", "cpu-tiny")["cost"]
    assert cost["per_hour"] is None and cost["total"] is None and "--gpu-price" in cost["price_source"]
    assert _plan(capsys, "--preset", "cpu-tiny", "--gpu-price", "0.05")["cost"]["per_hour"] == pytest.approx(0.05 * 2)


def test_the_text_output_has_one_cost_line(capsys):
    assert main(["plan", "--preset", PRESET]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cost:")]
    assert len(lines) == 1
    assert "16 GPUs × 0.69 USD/GPU-h = 11.04 USD/h; total" in lines[0] and "as known on" in lines[0]


def test_the_users_prices_yaml_replaces_bundled_rows(capsys, monkeypatch, tmp_path):
    """$XDG_CONFIG_HOME/scaletrain/prices.yaml (no SCALETRAIN_CONFIG_DIR): its rows over the bundled ones."""
    monkeypatch.delenv("SCALETRAIN_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "scaletrain").mkdir()
    path = tmp_path / "scaletrain" / "prices.yaml"
    path.write_text("currency: EUR\nprices:\n  rtx 4090: {per_gpu_hour: 0.40, source: my contract}\n  H100: 1.5\n")
    cost = _plan(capsys, "--preset", PRESET)["cost"]
    assert cost["currency"] == "EUR" and cost["per_hour"] == pytest.approx(0.40 * 16)
    assert cost["price_source"] == f"my contract ({path})"
    table = price_table()
    assert table.price("H100-SXM").per_gpu_hour == 1.5 and table.price("H100-SXM").source == str(path)
    assert table.price("L40S") == bundled_prices().price("L40S")          # the rest stay
    assert price_table("RTX4090", 0.33).price("RTX4090").per_gpu_hour == 0.33   # --gpu-price over the file


@pytest.mark.parametrize("text,needle", [
    ("prices: [1, 2]\n", "no 'prices:' mapping"),
    ("prices:\n  H100: -1\n", "H100: price '-1' is not accepted"),
    ("prices:\n  H100: .nan\n", "is not accepted"),
    ("prices:\n  Banana9000: 1.0\n", "unknown GPU 'Banana9000'"),
    ("prices:\n  H100: {per_gpu_hour: 1, cost: 2}\n", "unknown key 'cost'"),
    ("currency: 12\nprices:\n  H100: 1\n", "is not a currency code"),
    ("prices: {H100: [\n", "is not valid YAML"),
    ("!!python/object/apply:os.system ['echo hi']\n", "is not valid YAML"),
    ("a: &a [1]\n" + "".join(f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdef", "bcdefg"))
     + "prices: {}\n",
     "more than 100,000 values"),
])
def test_a_bad_price_file_is_one_line(text, needle, tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(ScaletrainError) as e:
        read_user_prices(path)
    assert needle in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_fifo_price_file_is_refused_without_waiting(tmp_path):
    path = tmp_path / "prices.yaml"
    os.mkfifo(path)
    with pytest.raises(ScaletrainError, match="not a regular file|FIFO|fifo"):
        read_user_prices(path)


@pytest.mark.parametrize("argv,needle", [
    (["--gpu-price", "-1"], "--gpu-price '-1' is not accepted; give a price in USD per GPU-hour"),
    (["--gpu-price", "abc"], "--gpu-price 'abc' is not accepted"),
    (["--gpu-price", "5000"], "at most 1,000"),
    (["--sort", "cost"], "--sort cost ranks the rows of --table gpus; give --table gpus too"),
])
def test_bad_cost_flags_are_one_line_and_exit_2(argv, needle):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    r = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "plan", "--preset", "cpu-tiny", *argv], env=env,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def gpus_rows():
    """`--table gpus` rows of the preset, in catalog order, by time and by cost (JSON)."""
    out = {}
    for sort in (None, "time", "cost"):
        r = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli", "plan", "--preset", PRESET, "--table", "gpus",
                            "--json", *(["--sort", sort] if sort else [])],
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")},
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        out[sort] = json.loads(r.stdout)["table"]["rows"]
    return out


@pytest.mark.long
def test_table_gpus_rows_carry_their_cost(gpus_rows):
    fitting = [r for r in gpus_rows[None] if r["fits"]]
    assert fitting and all("cost" not in r for r in gpus_rows[None] if not r["fits"])
    steps = None
    for r in fitting:
        price = bundled_prices().price(r["gpu"]).per_gpu_hour
        assert r["cost"]["per_hour"] == pytest.approx(price * r["world_size"])
        steps = r["cost"]["hours"] * 3600 / r["step_seconds"] if steps is None else steps
        assert r["cost"]["hours"] * 3600 == pytest.approx(steps * r["step_seconds"])    # the same steps everywhere
        assert r["cost"]["total"] == pytest.approx(r["cost"]["per_hour"] * r["cost"]["hours"])


@pytest.mark.long
def test_table_gpus_ranks_by_time_and_by_cost(gpus_rows):
    key = lambda r: (r["gpu"], r["nodes"], r["gpus_per_node"])       # noqa: E731
    assert sorted(map(key, gpus_rows["time"])) == sorted(map(key, gpus_rows[None]))    # the same rows
    fit_time = [r for r in gpus_rows["time"] if r["fits"]]
    fit_cost = [r for r in gpus_rows["cost"] if r["fits"]]
    assert [r["step_seconds"] for r in fit_time] == sorted(r["step_seconds"] for r in fit_time)
    assert [r["cost"]["total"] for r in fit_cost] == sorted(r["cost"]["total"] for r in fit_cost)
    assert key(fit_time[0]) != key(fit_cost[0])          # the fastest is not the cheapest here
    n = len(fit_time)
    assert all(r["fits"] for r in gpus_rows["cost"][:n]) and not any(r["fits"] for r in gpus_rows["cost"][n:])


@pytest.mark.long
def test_table_gpus_text_shows_price_and_cost_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", "--preset", PRESET, "--table", "gpus", "--sort", "cost"]) == 0
    out = capsys.readouterr().out
    head = next(ln for ln in out.splitlines() if ln.lstrip().startswith("GPU ") and "cost" in ln)
    assert "USD/h" in head


@pytest.mark.long
@pytest.mark.parametrize("extra", [[], ["--dataset-size", "10000"]])
def test_table_gpus_fits_80_columns_with_every_number_whole(capsys, monkeypatch, extra):
    """At 80 columns the GPU table cut its numbers ("179…" GiB, "2.0…" s, "0.0028/…"): every column but a reason
    now fits whole (the memory column left out there, the epoch column only with a run length)."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpus", "8xH100", "--method", "lora", "--table",
                 "gpus", *extra]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("GPUs × count"))
    head = lines[start + 1].split()
    assert head[-2:] == ["USD/h", "cost"] and ("epoch" in head) == bool(extra) and "memory" not in head
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("plan: strategy"))
    rows = lines[start + 3:end]
    fitting = [ln for ln in rows if "GiB" in ln]
    assert len(fitting) > 10 and all(len(ln.rstrip()) <= 80 and "…" not in ln for ln in fitting), fitting
