"""The fuzz properties of tests/frontends/test_fuzz.py, run for longer (issue 29, build 6): each property in turn with a large
max_examples until --minutes run out (default 30), recording what each found in bench/results/fuzz_long-vm.json with
the machine, its load and the versions. Run at low priority: `nice -n 10 python bench/fuzz_long.py`.

A property that fails is recorded with hypothesis' minimal failing example and the error, and the run goes on with
the next property (a found failure is fixed, then the run repeated)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
# the test floors, as pyproject's pytest pythonpath has them: test_fuzz lives in tests/frontends/ and imports helpers
# of the other floors by module name
sys.path[:0] = [str(TESTS), *(str(TESTS / floor) for floor in ("engine", "trainer", "frontends", "e2e")), str(HERE)]


def _versions() -> dict:
    import hypothesis

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "../src"], cwd=HERE, capture_output=True, text=True)
    return {"python": sys.version.split()[0], "hypothesis": hypothesis.__version__,
            "scaletrain_commit": commit.stdout.strip(), "src_dirty": bool(dirty.stdout.strip())}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--examples", type=int, default=500, help="max_examples per round (rounds repeat until the time is up)")
    p.add_argument("--out", default=str(HERE / "results" / "fuzz_long-vm.json"))
    p.add_argument("--only", nargs="*", help="run only these properties (all by default)")
    a = p.parse_args()
    os.environ.setdefault("SCALETRAIN_CACHE", "/tmp/scaletrain-fuzz-long-cache")
    os.environ.setdefault("SCALETRAIN_FUZZ_DEADLINE_S", "60")     # a trace process's start under load: not a hang
    os.environ.setdefault("SCALETRAIN_CONFIG_DIR", "/tmp/scaletrain-fuzz-long-config")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import test_fuzz as F
    from machine import machine
    from scaletrain.tui.cli.main import main as cli

    run = Path(os.environ["SCALETRAIN_CACHE"]).parent / "scaletrain-fuzz-long-run"
    if not (run / "plan.json").exists():
        assert cli(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(run)]) == 0
    props = {
        "plan_flags": (F.prop_plan_flags, [F.plan_argv()]),
        "dry_run": (F.prop_dry_run, [F.dry_run_argv().map(lambda t: t[0]), st.none() | F.data_file()]),
        "config_json": (F.prop_config_json, [F.config_json()]),
        "preset_yaml": (F.prop_preset_yaml, [F.preset_yaml()]),
        "data_files": (F.prop_data, [F.data_file(), st.sampled_from(["sft", "dpo", "grpo"])]),
        "run_files": (lambda n, c: F.prop_run_file(run, n, c), [F.RUN_FILES, F.RUN_CONTENT]),
        "diagnose_logs": (lambda c, w: F.prop_diagnose(c, w, run), [F.log_text(), st.booleans()]),
        "commands": (lambda argv: F.prop_command(argv, run), [F.command_argv()]),
    }
    if a.only:
        props = {k: v for k, v in props.items() if k in a.only}
    started = time.time()
    record = {"what": "tests/frontends/test_fuzz.py's properties (the CLI contract: exit 0 with a result, or one line ≤ 500 "
                      "characters and exit 2/3; no traceback, hang, write outside the example's folder or child left), "
                      "each run in turn with a large max_examples until the time is up",
              "machine": machine(), "versions": _versions(), "minutes": a.minutes,
              "deadline_per_example_s": float(os.environ["SCALETRAIN_FUZZ_DEADLINE_S"]), "properties": {}}
    per_prop_s = a.minutes * 60 / len(props)
    for name, (fn, strategies) in props.items():
        counter = {"n": 0}

        def make(fn=fn, counter=counter):
            def counted(args):
                counter["n"] += 1
                fn(*args)
            return counted

        counted = make()

        t0 = time.time()
        entry = {"found": None}
        # hypothesis has no wall-clock stop: rounds of --examples examples, each with a fresh random seed, until
        # this property's share of the time is spent
        rounds = 0
        while time.time() - t0 < per_prop_s:
            rounds += 1
            test = settings(max_examples=a.examples, deadline=None, database=None,
                            suppress_health_check=list(HealthCheck))(given(st.tuples(*strategies))(counted))
            try:
                test()
            except BaseException as e:                      # a failure: recorded, and on to the next property
                entry["found"] = {"error": f"{e.__class__.__name__}: {str(e)[:2000]}",
                                  "example": "\n".join(getattr(e, "__notes__", []))[:4000],
                                  "traceback_tail": traceback.format_exc()[-3000:]}
                break
        entry.update(examples=counter["n"], rounds=rounds, seconds=round(time.time() - t0, 1))
        record["properties"][name] = entry
        print(f"{name}: {counter['n']} examples in {entry['seconds']} s, found: "
              f"{'nothing' if entry['found'] is None else entry['found']['error'][:300]}", flush=True)
    record["seconds"] = round(time.time() - started, 1)
    record["load_average_1m_at_end"] = os.getloadavg()[0]
    record["found_nothing"] = all(v["found"] is None for v in record["properties"].values())
    Path(a.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0 if record["found_nothing"] else 1


if __name__ == "__main__":
    sys.exit(main())
