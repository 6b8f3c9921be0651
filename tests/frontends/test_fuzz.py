"""Issue 29, build 6: property-based tests (hypothesis) over the CLI's flags and every file format the tool reads.

The contract, for any input: exit 0 with a result on stdout, or exactly one line "scaletrain: error: …" of at most
500 characters with exit 2 (3: "does not fit"); never a traceback (SCALETRAIN_DEBUG=1, so an exception no check
foresaw escapes main() and fails the example), never a hang (an alarm per example), never a file written outside
the example's own folder, never a child process left behind. Everything runs in-process through the CLI's main()
to stay fast; CI runs a bounded budget (FUZZ_EXAMPLES examples per property, FUZZ_DEADLINE_S per example), and
bench/fuzz_long.py runs the same properties for 30 minutes (bench/results/fuzz_long-vm.json).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import string
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scaletrain.engine.catalog.architectures import catalog_entry
from scaletrain.engine.request.fields import FIELDS
from scaletrain.tui.cli.main import main
from scaletrain.tui.cli.parser import build_parser

TINY = "scaletrain/tiny-qwen2"
FUZZ_EXAMPLES = int(os.environ.get("SCALETRAIN_FUZZ_EXAMPLES", "25"))
# one example (a plan, a monitor snapshot, a diagnosis): longer is a hang. A config.json of a model type without an
# analytic layout starts the trace process (torch's import: 10-50 s on the 2-core VM under a load of 8), so the long
# run allows more.
FUZZ_DEADLINE_S = float(os.environ.get("SCALETRAIN_FUZZ_DEADLINE_S", "20"))
MAX_LINE = 500
PLAN = ["plan", "--model", TINY, "--gpus", "2xCPU"]


class Hang(BaseException):
    """Raised by the alarm: not an Exception, so main()'s catch-all cannot turn it into a line."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"no answer within {FUZZ_DEADLINE_S} s")


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st_ = p.lstat()
            out[str(p.relative_to(root))] = (st_.st_size, st_.st_mtime_ns)
    return out


def check_contract(argv: list[str], root: Path, writes_ok: bool = False,
                   stdout_check: Callable[[str], None] | None = None) -> int:
    """Run main(argv) with `root` as the working directory and HOME; assert the contract; the exit code."""
    before = _tree(root)
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, FUZZ_DEADLINE_S)
    cwd = os.getcwd()
    env = {k: os.environ.get(k) for k in ("HOME", "SCALETRAIN_DEBUG", "HF_HOME")}
    stdin = sys.stdin
    try:
        os.chdir(root)
        os.environ.update(HOME=str(root / "home"), SCALETRAIN_DEBUG="1", HF_HOME=str(root / "home" / "hf"))
        sys.stdin = io.StringIO("")          # at its end, as under `< /dev/null` (chat's conversation reads it)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        sys.stdin = stdin
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(cwd)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    o, e = out.getvalue(), err.getvalue()
    kids = [k for k in psutil.Process().children(recursive=True) if not _trace_worker(k)]
    assert not kids, f"{argv[:4]}: {len(kids)} child process(es) left: {[k.name() for k in kids]}"
    assert "Traceback" not in e, (argv[:4], e[-2000:])          # stdout may quote a log that holds one
    if code == 0 or (code == 3 and not e.strip()):   # 3: the plan, with its "does not fit" verdict, is the result
        assert o.strip(), f"{argv[:4]}: exit {code} and no result"
        if stdout_check is not None:
            stdout_check(o)
    else:
        assert code in (2, 3), f"{argv[:6]}: exit {code}: {e[-1000:]!r}"
        lines = e.strip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("scaletrain: error: "), f"{argv[:6]}: {e[-1000:]!r}"
        assert len(lines[0]) <= MAX_LINE, f"{argv[:6]}: a {len(lines[0])}-character line"
        assert lines[0].isprintable(), f"{argv[:6]}: control characters in {lines[0]!r}"
    after = _tree(root)
    changed = sorted(set(after.items()) ^ set(before.items()))
    if writes_ok:                    # a run directory under root/run, and only there (and only on success)
        changed = [c for c in changed if not (code in (0, 3) and c[0].split(os.sep)[0] == "run")]
    assert not changed, f"{argv[:6]}: files changed: {changed[:5]}"
    return code


def _trace_worker(p: psutil.Process) -> bool:
    """The one trace process a planning process keeps (engine/catalog/traced.py: `--serve`, stopped at exit and
    on its stdin's end): this process's helper, not a child an example left."""
    try:
        if p.status() == psutil.STATUS_ZOMBIE:         # exited, not yet reaped: nothing runs
            return True
        cmd = p.cmdline()
    except psutil.Error:
        return True                                   # already gone
    return "scaletrain.measure.trace" in cmd and "--serve" in cmd


@contextlib.contextmanager
def sandbox() -> Any:
    root = Path(tempfile.mkdtemp(prefix="scaletrain-fuzz-"))
    (root / "home").mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---- strategies ----------------------------------------------------------------------------------------------------
SAFE_TEXT = st.text(alphabet=st.characters(blacklist_characters="/~\x00", blacklist_categories=("Cs",)), max_size=30)
NUMBERS = st.one_of(st.integers(-10, 10), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["1e309", "-0", "nan", "inf", "0x10", "1_000", " 8", "8 ", "", "4x"]))
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | SAFE_TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(SAFE_TEXT, inner, max_size=4),
                    max_leaves=12)


def _value(f: Any) -> st.SearchStrategy[str]:
    if f.choices:
        return st.one_of(st.sampled_from([str(c) for c in f.choices]), SAFE_TEXT)
    return st.one_of(NUMBERS.map(str), SAFE_TEXT, st.sampled_from(["4xH200", "q_proj,v_proj", "prompt=q", "x=y,"]))


PLAN_FLAGS = [f for f in FIELDS if f.group is not None and f.name not in ("data", "eval_data", "weights", "model")]


@st.composite
def plan_argv(draw: Any) -> list[str]:
    argv = list(PLAN)
    for f in draw(st.lists(st.sampled_from(PLAN_FLAGS), max_size=4, unique_by=lambda f: f.name)):
        if f.kind == "flag":
            argv.append(draw(st.sampled_from([f.flag, "--no-" + f.flag[2:]])))
        else:
            argv += [f.flag, draw(_value(f))]
    if draw(st.booleans()):
        argv.append("--json")
    return argv


def _tiny_config() -> dict[str, Any]:
    return dict(catalog_entry(TINY)["config"])


@st.composite
def config_json(draw: Any) -> bytes:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=200))
    cfg = _tiny_config()
    for key in draw(st.lists(st.sampled_from(sorted(cfg)), max_size=3)):
        cfg[key] = draw(JSON)
    return json.dumps(cfg).encode()


RECORD_KEYS = ["text", "prompt", "completion", "response", "messages", "chosen", "rejected", "role", "content", "x"]
RECORD = st.recursive(st.none() | st.booleans() | st.integers() | SAFE_TEXT,
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                          st.sampled_from(RECORD_KEYS + ["system", "user", "assistant"]), inner, max_size=3),
                      max_leaves=8)


@st.composite
def data_file(draw: Any) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["jsonl", "json", "csv", "raw-jsonl", "raw-csv"]))
    records = draw(st.lists(st.dictionaries(st.sampled_from(RECORD_KEYS), RECORD, max_size=3), min_size=0,
                            max_size=5))
    if kind == "jsonl":
        return "d.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode()
    if kind == "json":
        return "d.json", json.dumps(draw(st.one_of(st.just(records), JSON))).encode()
    if kind == "csv":
        cols = draw(st.lists(st.sampled_from(RECORD_KEYS), min_size=1, max_size=3, unique=True))
        rows = draw(st.lists(st.lists(SAFE_TEXT, min_size=len(cols), max_size=len(cols)), max_size=4))
        import csv

        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(cols)
        w.writerows(rows)
        return "d.csv", buf.getvalue().encode()
    return ("d.jsonl" if kind == "raw-jsonl" else "d.csv"), draw(st.binary(max_size=200))


YAML_LINES = ["description: x", "request:", "  model: " + TINY, "  gpus: 2xCPU", "  micro_batch: 2", "train:",
              "  lr: 1e-4", "  seed: 3", "  max_steps: 2", "&a [*a]", "- 1", "request: {model: *x}", "  epochs: .nan",
              "  gpus: [1, 2]", ": :", "\t", "  lr: !!python/object:os.system 'x'", "request: 5"]


@st.composite
def preset_yaml(draw: Any) -> bytes:
    if draw(st.integers(0, 5)) == 0:
        return draw(st.binary(max_size=200))
    lines = draw(st.lists(st.one_of(st.sampled_from(YAML_LINES), SAFE_TEXT.map(lambda t: "  " + t)), max_size=8))
    return ("\n".join(["description: fuzz", "request:", "  model: " + TINY, "  gpus: 2xCPU"] + lines) + "\n").encode()


LOG_PIECES = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total)",
              "Traceback (most recent call last):", "NCCL error", "\x1b]52;c;ZWNobyBoaQ==\x07", "\x1b]0;title\x07",
              "\x1b[2J\x1b[H", "[rank1]: RuntimeError: x", "Killed", "\r", "\u202e", "step 3 loss 2.1", "\x00"]


@st.composite
def log_text(draw: Any) -> bytes:
    parts = draw(st.lists(st.one_of(st.sampled_from(LOG_PIECES), st.text(max_size=40)), max_size=12))
    sep = draw(st.sampled_from(["\n", "", "\r\n", " "]))
    return sep.join(parts).encode("utf-8", "surrogatepass")


# ---- a run directory to damage ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz-run") / "run"
    assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(d)]) == 0
    return d


def _no_terminal_escapes(out: str) -> None:
    assert all(c.isprintable() or c == "\n" for c in out), f"raw control characters printed: {out[:300]!r}"


# ---- the properties (bench/fuzz_long.py runs these same functions for longer) -------------------------------------
def prop_plan_flags(argv: list[str]) -> None:
    with sandbox() as root:
        check_contract(argv, root)


PRESETS = ["cpu-tiny", "cpu-tiny-dpo", "cpu-tiny-grpo", "cpu-tiny-reward"]
SET_KEYS = ["micro_batch", "grad_accum", "seq_len", "epochs", "train.lr", "train.seed", "train.max_steps",
            "train.packing", "train.eval_fraction", "train.data_columns", "train.dataset", "train.report_to",
            "train.lora_dropout", "train.warmup_ratio", "method", "strategy", "train.keep_checkpoints", "name"]


@st.composite
def dry_run_argv(draw: Any) -> tuple[list[str], tuple[str, bytes] | None]:
    """A headless dry run of a preset with --set overrides, plan flags and maybe generated --data."""
    argv = ["--preset", draw(st.sampled_from(PRESETS))]
    for key in draw(st.lists(st.sampled_from(SET_KEYS), max_size=3, unique=True)):
        argv += ["--set", f"{key}={draw(st.one_of(NUMBERS.map(str), SAFE_TEXT, JSON.map(json.dumps)))}"]
    for f in draw(st.lists(st.sampled_from(PLAN_FLAGS), max_size=2, unique_by=lambda f: f.name)):
        argv += [f.flag] if f.kind == "flag" else [f.flag, draw(_value(f))]
    data = draw(st.one_of(st.none(), data_file()))
    return argv, data


def prop_dry_run(argv: list[str], data: tuple[str, bytes] | None) -> None:
    with sandbox() as root:
        extra = []
        if data is not None:
            (root / data[0]).write_bytes(data[1])
            extra = ["--data", str(root / data[0]), "--dataset-size", "100"]      # no profile child: fast
        check_contract([*argv, *extra, "--headless", "--dry-run", "--run-dir", str(root / "run")], root,
                       writes_ok=True)


def prop_config_json(content: bytes) -> None:
    with sandbox() as root:
        (root / "m").mkdir()
        (root / "m" / "config.json").write_bytes(content)
        check_contract(["plan", "--model", str(root / "m"), "--gpus", "2xCPU"], root)


def prop_preset_yaml(content: bytes) -> None:
    with sandbox() as root:
        (root / "p.yaml").write_bytes(content)
        check_contract(["plan", "--preset", str(root / "p.yaml")], root)


def prop_data(named: tuple[str, bytes], objective: str) -> None:
    name, content = named
    with sandbox() as root:
        (root / name).write_bytes(content)
        check_contract([*PLAN, "--weights", "random-init", "--dataset-size", "100", "--objective", objective,
                        "--data", str(root / name)], root)


def prop_run_file(run: Path, name: str, content: bytes) -> None:
    with sandbox() as root:
        d = root / "run"
        shutil.copytree(run, d)
        (d / name).write_bytes(content)
        check_contract(["monitor", str(d), "--headless", "--once"], root, stdout_check=_no_terminal_escapes)


def prop_diagnose(content: bytes, with_plan: bool, run: Path) -> None:
    with sandbox() as root:
        (root / "rank0.log").write_bytes(content)
        argv = ["diagnose", str(root / "rank0.log")] + (["--plan", str(run / "plan.json")] if with_plan else [])
        check_contract(argv, root, stdout_check=_no_terminal_escapes)


# ---- every other command's flags, drawn from the parser itself (a flag added later is drawn too) --------------------
# Not drawn: `plan` (its own property above), `launch` and `validate` (they train), config write's --install-default
# (it writes the user's accelerate default, outside the run) and the flags that name the model or its data (a model
# folder would start the trace process: prop_config_json draws those); `monitor` runs --headless --once (the app and
# the stream wait for the run).
NOT_DRAWN_COMMANDS = ("plan", "launch", "validate")
NOT_DRAWN_DESTS = ("help", "install_default", "model", "data", "eval_data", "weights", "run_dir")
COMMAND_PATHS = ["run", "run/plan.json", "run/status.json", "run/logs", "run/checkpoints", "missing", ".", "home",
                 "run/../run"]


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each drawn command's parser by its words ("config write")."""
    out = {}
    for name, sp in _subcommands(build_parser()).items():
        if name in NOT_DRAWN_COMMANDS:
            continue
        nested = [a for a in sp._actions if isinstance(a, argparse._SubParsersAction)]
        out.update({f"{name} {n}": s for n, s in _subcommands(sp).items()} if nested else {name: sp})
    return out


COMMAND_PARSERS = command_parsers()


def _arg(draw: Any, a: argparse.Action) -> str:
    if a.choices:
        return draw(st.one_of(st.sampled_from([str(c) for c in a.choices]), SAFE_TEXT))
    return draw(st.one_of(st.sampled_from(COMMAND_PATHS), NUMBERS.map(str), SAFE_TEXT))


@st.composite
def command_argv(draw: Any) -> list[str]:
    name = draw(st.sampled_from(sorted(COMMAND_PARSERS)))
    sp = COMMAND_PARSERS[name]
    argv = name.split()
    if name == "config write":                  # a plan it can write (drawn flags after these may change it)
        argv += ["--model", TINY, "--gpus", "2xCPU", "--run-dir", draw(st.sampled_from(["run", "run/new"]))]
    for a in sp._actions:                       # positionals: one value, two for nargs + or *, maybe none for ?
        if a.option_strings or a.nargs == "?" and draw(st.booleans()):
            continue
        argv += [_arg(draw, a) for _ in range(draw(st.integers(1, 2)) if a.nargs in ("+", "*") else 1)]
    options = [a for a in sp._actions if a.option_strings and a.dest not in NOT_DRAWN_DESTS]
    for a in draw(st.lists(st.sampled_from(options), max_size=4, unique_by=lambda a: a.dest)) if options else ():
        flag = draw(st.sampled_from(a.option_strings))
        argv += [flag] if a.nargs == 0 else [flag, _arg(draw, a)]
    if name == "monitor":
        argv += ["--headless", "--once"]
    return argv


def prop_command(argv: list[str], run: Path) -> None:
    with sandbox() as root:
        shutil.copytree(run, root / "run")
        check_contract(argv, root, writes_ok=True, stdout_check=_no_terminal_escapes)


RUN_FILES = st.sampled_from(["plan.json", "status.json", "metrics.jsonl"])
RUN_CONTENT = st.one_of(JSON.map(lambda v: json.dumps(v).encode()), st.binary(max_size=200),
                        st.lists(JSON.map(json.dumps), max_size=5).map(lambda ls: "\n".join(ls).encode()))


def ci_settings(f: Callable) -> Callable:
    return settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))(f)


@pytest.mark.long
@ci_settings
@given(plan_argv())
def test_fuzz_plan_flags(argv):
    prop_plan_flags(argv)


def _tiny_with(**changes: Any) -> bytes:
    return json.dumps({**_tiny_config(), **changes}).encode()


@ci_settings
@given(config_json())
@example(_tiny_with(sliding_window={"a": 1}))           # found by bench/fuzz_long.py: a TypeError in the planner
@example(_tiny_with(model_type=None))                   # found: started the trace process (50 s under load)
@example(_tiny_with(model_type="x\u0013y"))
@example(_tiny_with(layer_types="sliding_attention", sliding_window=8))
@example(_tiny_with(tie_word_embeddings="yes", rope_theta=float("inf")))
def test_fuzz_config_json(content):
    prop_config_json(content)


@ci_settings
@given(dry_run_argv())
def test_fuzz_dry_run(argv_data):
    prop_dry_run(*argv_data)


@ci_settings
@given(preset_yaml())
def test_fuzz_preset_yaml(content):
    prop_preset_yaml(content)


@ci_settings
@given(data_file(), st.sampled_from(["sft", "dpo", "grpo"]))
def test_fuzz_data_files(named, objective):
    prop_data(named, objective)


def test_fuzz_run_files(good_run):
    @ci_settings
    @given(RUN_FILES, RUN_CONTENT)
    def inner(name, content):
        prop_run_file(good_run, name, content)
    inner()


@pytest.mark.long
def test_fuzz_diagnose_logs(good_run):
    @ci_settings
    @given(log_text(), st.booleans())
    def inner(content, with_plan):
        prop_diagnose(content, with_plan, good_run)
    inner()


def test_fuzz_every_command(good_run):
    @ci_settings
    @given(command_argv())
    def inner(argv):
        prop_command(argv, good_run)
    inner()


def test_every_command_but_the_training_ones_is_drawn():
    """The commands come from the parser: a command added later is drawn without a change here."""
    assert set(COMMAND_PARSERS) == {"gpus", "models", "presets", "config write", "runs", "stop", "diagnose", "monitor",
                                    "export", "chat", "env", "completion"}


def test_the_contract_checker_can_fail():
    """A checker that cannot fail proves nothing: a write, a refused result and raw escapes are each caught."""
    with sandbox() as root:
        assert check_contract(["plan", "--model", TINY, "--gpus", "2xCPU", "--seq-len", "0"], root) == 2
        with pytest.raises(AssertionError, match="files changed"):
            check_contract(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(root / "r")], root)
        with pytest.raises(AssertionError, match="raw control characters"):
            check_contract(["plan", "--model", TINY, "--gpus", "2xCPU"], root,
                           stdout_check=lambda o: _no_terminal_escapes(o + "\x1b]0;x\x07"))


@pytest.mark.long
def test_the_long_fuzz_run_imports_these_properties_and_runs_them(tmp_path):
    """bench/fuzz_long.py runs this file's properties for half an hour: it must find them wherever the test floors put
    this file (it imported `test_fuzz` from tests/ alone and failed at its first line after the floors were made)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "fuzz.json"
    env = dict(os.environ, SCALETRAIN_CACHE=str(tmp_path / "cache"), SCALETRAIN_CONFIG_DIR=str(tmp_path / "config"))
    done = subprocess.run([sys.executable, str(root / "bench" / "fuzz_long.py"), "--minutes", "0.02", "--examples",
                           "2", "--only", "config_json", "preset_yaml", "--out", str(out)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    props = json.loads(out.read_text())["properties"]
    assert set(props) == {"config_json", "preset_yaml"}
    assert all(p["found"] is None and p["examples"] >= 2 for p in props.values()), props
