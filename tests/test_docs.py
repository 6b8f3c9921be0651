"""The docs: a README that fits a screen with its pictures, a site `mkdocs build --strict` builds offline, a command
reference (docs/reference.md) that is current and names every flag of every sub-parser and every preset / `--set`
key, and each generated table section (bench/readme_tables.py) in exactly one page."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

from scaletrain.tui.cli.main import main
from scaletrain.tui.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"
README_LIMIT = 12 * 1024


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) for the top level and every sub-parser, nested ones included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def sections(text: str) -> dict[str, str]:
    """The reference's `## ` sections by heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def undocumented(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """Every flag (`scaletrain plan --json`) the reference does not name in its command's section."""
    by_heading = sections(text)
    missing = []
    for path, sub in commands(parser):
        heading = next((h for h in by_heading if h.split(" (")[0] == " ".join(("scaletrain", *path))), None)
        if heading is None:
            missing.append(" ".join(("scaletrain", *path)))
            continue
        for action in sub._actions:
            for flag in action.option_strings:
                if f"`{flag}`" not in by_heading[heading]:
                    missing.append(f"{' '.join(('scaletrain', *path))} {flag}")
    return missing


def cli_keys(capsys) -> list[dict]:
    assert main(["plan", "--keys", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_reference_is_current():
    gen = load(ROOT / "docs" / "gen_reference.py", "gen_reference")
    assert REFERENCE.read_text() == gen.reference(), \
        "docs/reference.md is stale: run `PYTHONPATH=src python docs/gen_reference.py`"


def test_the_reference_names_every_flag_of_every_sub_parser():
    parser = build_parser()
    paths = [p for p, _ in commands(parser)]
    assert ("config", "write") in paths and ("plan",) in paths and len(paths) >= 14
    assert undocumented(REFERENCE.read_text(), parser) == []


def test_the_flag_check_finds_a_missing_flag_and_a_missing_command():
    parser = build_parser()
    text = REFERENCE.read_text()
    without_row = "\n".join(line for line in text.splitlines() if not line.startswith("| `--host-ram`"))
    assert sorted(undocumented(without_row, parser)) == [
        "scaletrain --host-ram",
        "scaletrain config write --host-ram", "scaletrain plan --host-ram", "scaletrain validate --host-ram"]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.add_parser("newcmd").add_argument("--new-flag")
    assert undocumented(text, parser) == ["scaletrain newcmd"]
    sub.choices["plan"].add_argument("--another-flag")
    assert "scaletrain plan --another-flag" in undocumented(text, parser)


def test_the_reference_names_every_preset_and_set_key(capsys):
    keys = cli_keys(capsys)
    table = sections(REFERENCE.read_text())["Preset and `--set` keys"]
    rows = {(m.group(1), m.group(2)) for m in re.finditer(r"^\| (\w+) \| `(\w+)` \|", table, flags=re.M)}
    assert len(keys) > 50
    assert {(k["section"] or "preset", k["key"]) for k in keys} == rows
    for k in keys:
        if k["flag"]:
            row = next(line for line in table.splitlines() if line.startswith(f"| {k['section'] or 'preset'} | "
                                                                               f"`{k['key']}` |"))
            assert row.endswith(f"`{k['flag']}` |"), row


def test_the_reference_gives_each_flag_its_help_and_default():
    text = sections(REFERENCE.read_text())
    plan = text["scaletrain plan"]
    row = next(line for line in plan.splitlines() if line.startswith("| `--micro-batch`"))
    assert "(default:" in row
    launch = next(line for line in text["scaletrain launch"].splitlines() if line.startswith("| `--resume`"))
    assert len(launch.split(" | ")[2]) > 10                           # its help text
    for heading, body in text.items():
        for line in body.splitlines():
            if line.startswith("| `-") and not line.startswith(("| `-h`", "| `--version`")):
                assert line.rstrip(" |").split(" | ")[-1].strip(), (heading, line)   # no flag without help


def test_the_readme_fits_a_screen_with_its_pictures_and_links():
    text = README.read_text()
    assert len(text.encode()) <= README_LIMIT, f"README.md is {len(text.encode())} bytes, more than {README_LIMIT}"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert any(i.startswith("docs/images/") for i in images)
    links = [u.split("#")[0] for u in re.findall(r"\]\(([^)]+)\)", text) if "://" not in u]
    assert "docs/reference.md" in links
    for link in links:
        assert (ROOT / link).is_file(), link
    for command in ("make demo", "make test", "## Install"):
        assert command in text


def test_each_generated_table_is_in_exactly_one_page():
    sys.path.insert(0, str(ROOT / "bench"))
    tables = load(ROOT / "bench" / "readme_tables.py", "readme_tables")
    assert "architecture-sweep" in tables.SECTIONS
    for name in tables.SECTIONS:
        holders = [p for p in tables.pages() if f"<!-- BEGIN {name} -->" in p.read_text()]
        assert len(holders) == 1, (name, holders)
        assert f"<!-- END {name} -->" in holders[0].read_text()
        assert holders[0] != README, (name, "the tables live in docs/, not in the README")


def test_each_generated_table_is_what_its_results_give():
    """A results file re-recorded without its table regenerated left docs/benchmarks.md quoting an older machine's
    numbers: the tables are checked against bench/results/ as they are committed."""
    sys.path.insert(0, str(ROOT / "bench"))
    tables = load(ROOT / "bench" / "readme_tables.py", "readme_tables")
    assert tables.main(["--check"]) == 0


def test_the_site_builds_with_strict_checks(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "site" / "reference" / "index.html").is_file()
    assert (tmp_path / "site" / "images" / "wizard-plan.svg").is_file()
