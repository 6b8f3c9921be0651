"""`scaletrain env [--json]`: this machine as a bug report wants it (engine/run/environment.py), as plain lines to
paste or one JSON object. Imports no torch: versions come from the installed distributions' metadata."""

from __future__ import annotations

import argparse
import json
from typing import Any

from scaletrain.tui.cli.plan_args import stated


def configure_env(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help=stated("print one JSON object", "off: lines to paste"))


def cmd_env(args: argparse.Namespace) -> int:
    from scaletrain.engine.run.environment import collect_environment

    env = collect_environment().to_json()
    if args.json:
        print(json.dumps(env, indent=2))
        return 0
    print("Copy-paste the following information when reporting a bug:\n")
    for line in env_lines(env):
        print(f"- {line}")
    return 0


def _gpu_lines(g: dict[str, Any]) -> list[str]:
    from scaletrain.engine.units import fmt_bytes

    if not g["gpus"]:
        return [f"GPUs: none ({g['error'] or 'no NVIDIA GPU found'})"]
    lines = [f"NVIDIA driver: {g['driver_version'] or 'N/A'}, CUDA (driver): {g['cuda_driver_version'] or 'N/A'}",
             f"GPUs: {len(g['gpus'])}"]
    for d in g["gpus"]:
        mem = fmt_bytes(d["memory_total_bytes"]) if d["memory_total_bytes"] else "N/A"
        mig = "" if not d["mig_enabled"] else ", MIG on"
        lines.append(f"  GPU {d['index']}: {d['name'] or 'N/A'}, {mem}, {d['interconnect']}{mig}")
    return lines


def _accelerate_line(a: dict[str, Any]) -> list[str]:
    if not a["found"]:
        return [f"accelerate default config: not found ({a['path']})"]
    if a["error"]:
        return [f"accelerate default config: {a['path']} ({a['error']})"]
    out = [f"accelerate default config: {a['path']} (distributed_type {a['distributed_type']}, num_processes "
           f"{a['num_processes']}, mixed_precision {a['mixed_precision']})"]
    if a["deepspeed_config_file"]:
        found = {True: "found", False: "NOT FOUND", None: ""}[a["deepspeed_config_found"]]
        out.append(f"DeepSpeed config: {a['deepspeed_config_file']}" + (f" ({found})" if found else ""))
    else:
        out.append("DeepSpeed config: none named by the accelerate default config")
    return out


def env_lines(env: dict[str, Any]) -> list[str]:
    """The report as lines ('name: value'), every part on its own."""
    from scaletrain.engine.units import fmt_bytes

    py, plat = env["python"], env["platform"]
    ram = fmt_bytes(plat["ram_bytes"]) if plat["ram_bytes"] else "unknown"
    lines = [f"scaletrain version: {env['scaletrain']}",
             f"Python version: {py['version']} ({py['implementation']}, {py['executable']})",
             f"Platform: {plat['system']} ({plat['machine']}), {plat['cpu_cores']} cores, {ram} RAM"]
    lines += [f"{name} version: {v}" for name, v in env["packages"].items() if name != "scaletrain"]
    lines += _gpu_lines(env["gpus"])
    lines += _accelerate_line(env["accelerate_config"])
    ds_env = env["deepspeed_env_files"]
    lines.append(f"DeepSpeed env files: {', '.join(ds_env) if ds_env else 'none'}")
    lines += [f"{k}: {'unset' if v is None else v}" for k, v in env["environment"].items()]
    return lines
