"""`scaletrain plan --json` on every bundled preset (and a few flag variants and bad inputs) prints exactly what
was recorded in tests/fixtures/plan_json/: refactors keep plan output byte-identical.

After an intended change to plan output, regenerate and review:
    PYTHONPATH=src python tests/fixtures/record_plan_json.py && git diff tests/fixtures/plan_json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import record_plan_json as rec  # noqa: E402

_HOST = json.loads((rec.HERE / "host.json").read_text())
HOST, HOST_CORES = _HOST["mem_total_bytes"], _HOST.get("cpu_cores")
HOST_FIELDS = (("hardware", "gpu_memory_bytes"), ("memory", "capacity_bytes"), ("memory", "usable_bytes"),
               ("memory", "headroom_bytes"), ("hardware", "host_cores"), ("hardware", "cpu_threads_per_process"))


def _without_free_disk(text: str) -> str:
    """The verdict weighs a plan for this machine against the free space where its run directory goes (a temporary
    folder here): that space, and the folder's name, change from run to run; all else is compared byte for byte."""
    doc = json.loads(text)
    for check in doc.get("resources", {}).get("checks", []):
        if check["resource"] == "disk" and check["have_bytes"] is not None:
            check["have_bytes"], check["where"] = "FREE", "FREE"
    return json.dumps(doc, indent=2) + "\n"


def _without_host(text: str, cores_differ: bool) -> dict:
    """The CPU device plans against the host's RAM and divides its cores among its processes: on another host,
    compare all but the fields that follow them (with other cores, the CPU time model's numbers too)."""
    doc = json.loads(_without_free_disk(text))
    if doc["hardware"]["gpu"] == "CPU":
        for a, b in HOST_FIELDS:
            doc[a][b] = None
        for check in doc.get("resources", {}).get("checks", []):      # the memory limit is the host's RAM
            if check["resource"] == "gpu_memory":
                check["have_bytes"] = check["where"] = None
        if cores_differ:
            doc.pop("time", None)
    return doc


def test_every_bundled_preset_is_recorded():
    assert set(rec.cases()) == {p.stem for p in rec.HERE.glob("*.json") if p.stem != "host"} | {
        p.stem for p in rec.HERE.glob("*.err")}
    assert {p.stem for p in rec.PRESETS.glob("*.yaml")} <= set(rec.cases())


@pytest.fixture(scope="module")
def answers() -> dict[str, tuple[int, str, str]]:
    return rec.plan_json_in_one_process(rec.cases())


# a case of each kind also as its own `scaletrain plan` process, as the recorder ran them
ONE_PROCESS_EACH = ("cpu-tiny", "4090x8+lora", "err-set-unknown")


@pytest.mark.parametrize("name", sorted(rec.cases()))
def test_plan_json_is_as_recorded(name, answers):
    _expect_recorded(name, *answers[name])


@pytest.mark.parametrize("name", ONE_PROCESS_EACH)
def test_plan_json_is_as_recorded_in_a_process_of_its_own(name):
    _expect_recorded(name, *rec.plan_json(rec.cases()[name]))


def _expect_recorded(name: str, rc: int, out: str, err: str) -> None:
    got = rec.recorded(rc, out, err)
    want = (rec.HERE / f"{name}.{'err' if name.startswith('err-') else 'json'}").read_text()
    if name.startswith("err-"):
        assert got == want
    elif rec.host_memory_bytes() == HOST and rec.host_cores() == HOST_CORES:
        assert _without_free_disk(got) == _without_free_disk(want)
    else:
        cores_differ = rec.host_cores() != HOST_CORES
        assert _without_host(got, cores_differ) == _without_host(want, cores_differ)
