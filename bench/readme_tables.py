"""Regenerate the measured tables of the docs from bench/results/*.json (never typed by hand).

    .venv/bin/python bench/readme_tables.py          # rewrites the marked sections in place
    .venv/bin/python bench/readme_tables.py --check  # writes nothing: exit 1 if a section is not what the results give

A section is the text between `<!-- BEGIN name -->` and `<!-- END name -->` in README.md or any page under docs/
(docs/accuracy.md: architecture-sweep, cpu-groundtruth, gpu-accuracy; docs/benchmarks.md: bench-plan, bench-ui,
host-overhead); each name is in exactly one file (tests/test_docs.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def cpu_groundtruth() -> str:
    data = json.loads((RESULTS / "cpu_groundtruth.json").read_text())
    return (f"Machine: {data['machine']}; torch {data['torch']}, transformers {data['transformers']}. "
            f"Command: `{data['command']}`.\n\n" + groundtruth_table(data["cases"]))


def groundtruth_table(rows: list[dict]) -> str:
    out = ["| case | params & states exact | predicted peak | measured peak | error |",
           "|---|---|---:|---:|---:|"]
    for r in rows:
        keys = ("trainable", "optimizer_bytes") if r["method"] == "qlora" else (
            "params", "trainable", "weights_bytes", "optimizer_bytes")
        exact = all(r[f"{k}_predicted"] == r[f"{k}_measured"] for k in keys)
        mark = ("yes" if exact else "NO") + (" (adapters, states; NF4 packing)" if r["method"] == "qlora" else "")
        out.append(f"| {r['case']} | {mark} | {r['predicted_peak_bytes'] / 2**20:.2f} MiB | "
                   f"{r['measured_peak_bytes'] / 2**20:.2f} MiB | {100 * r['error']:+.1f}% |")
    out += ["", error_summary(rows)]
    return "\n".join(out)


def error_summary(rows: list[dict]) -> str:
    """The line under each ground-truth table: median and max |error| of the peaks."""
    errs = [abs(r["error"]) for r in rows]
    return (f"Median |error| **{100 * statistics.median(errs):.1f}%**, max **{100 * max(errs):.1f}%** "
            f"over {len(rows)} cases.")


def architecture_sweep() -> str:
    data = json.loads((RESULTS / "architecture_sweep.json").read_text())
    sm = data["summary"]
    rows = data["rows"]
    v = data["versions"]
    st = data["setup"]
    grid = ", ".join(st.get("grid_for", []))
    grid_text = ("full and LoRA × checkpointing off and on" if st.get("cases", "grid") == "grid" else
             f"full without and LoRA with checkpointing (the whole grid for {grid})")
    out = [f"transformers {v['transformers']}, torch {v['torch']}, peft {v['peft']}; micro-batch "
           f"{st['micro_batch']} × {st['seq_len']} tokens, fp32, {st['attn']}, AdamW; LoRA rank {st['lora_rank']}; "
           f"{grid_text}. Command: `PYTHONPATH=src .venv/bin/python bench/architecture_sweep.py --cases "
           f"{st.get('cases', 'grid')} --jobs 2` on {data['machine']['cpu_model']} "
           f"({data['machine']['cpu_cores']} cores, load {data['machine']['load_average_1m_at_start']:.1f}).", "",
           "| | count |", "|---|---:|",
           f"| model_types in transformers' causal-LM mapping | {sm['model_types'] + len(data.get('not_run', []))} |",
           f"| not run in this recording (the sweep was stopped; `--resume` runs them) | {len(data.get('not_run', []))} |",
           f"| run: planned and measured, or refused | {sm['model_types']} |",
           f"| planned and measured (traced: {sm['traced']}) | {sm['planned']} |",
           f"| cases (family × method × checkpointing) | {sm['cases']} |",
           f"| parameters and trainable parameters exact | {sm['params_exact']} of {sm['cases']} |",
           f"| median \\|error\\| of the allocated peak | {100 * (sm['median_abs_error'] or 0):.1f}% |",
           f"| largest over / under | {100 * (sm['max_over'] or 0):+.1f}% / {100 * (sm['max_under'] or 0):+.1f}% |",
           f"| cases under by more than 2 % / over by more than 5 % | {sm['under_2pct']} / {sm['over_5pct']} |",
           f"| refused (config does not build as a causal LM, or the engine says why) | {sm['refused']} |", ""]
    # by (model_type, case): two families can record equal cases (gemma3n and its text model)
    worst = sorted(((r["model_type"], c) for r in rows for c in r.get("cases", []) if "error" in c),
                   key=lambda rc: rc[1]["error"])[:3]
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if "refused" in r:
            reasons.setdefault(r["refused"].split(":")[0], []).append(r["model_type"])
    out.append("Refused, by who refused: " + "; ".join(f"{k} ({len(x)}): {', '.join(x)}"
                                                     for k, x in sorted(reasons.items())) + ".")
    shaped = [r for r in rows if r.get("shape") and "cases" in r]
    if shaped:
        out.append("")
        out.append("Measured at a shape of their own: " + "; ".join(
            f"{r['model_type']} " + ", ".join(f"{m} at {bs[0]} × {bs[1]}" for m, bs in r["shape"].items()
                                              if m != "why") + f" ({r['shape']['why']})" for r in shaped) + ".")
    own_loss = [r for r in rows if r.get("loss") == "chunked" and "cases" in r]
    if own_loss:
        out.append("")
        out.append("Planned and measured with the chunked loss (`--loss chunked`, the trainer's), their own loss "
                   "failing on a batch of text: " + "; ".join(
                       f"{r['model_type']} ({r['standard_loss_refused'].split('text (', 1)[-1].split(');')[0]})"
                       for r in own_loss) + ".")
    if worst:
        out.append("")
        out.append("Lowest three cases: " + ", ".join(
            f"{mt} {c['method']}{' ckpt' if c['grad_ckpt'] else ''} {100 * c['error']:+.1f}%" for mt, c in worst) + ".")
    return "\n".join(out)


def chunked_loss_sweep() -> str:
    """Traced and analytic families planned and measured with the trainer's chunked loss (`--loss chunked`)."""
    path = RESULTS / "architecture_sweep_chunked.json"
    if not path.is_file():
        return "_not recorded yet_"
    data = json.loads(path.read_text())
    sm, st, v = data["summary"], data["setup"], data["versions"]
    refused = [r["model_type"] for r in data["rows"] if "refused" in r]
    out = [f"transformers {v['transformers']}, torch {v['torch']}, peft {v['peft']}; micro-batch {st['micro_batch']} "
           f"× {st['seq_len']} tokens, fp32, AdamW; LoRA rank {st['lora_rank']}; every case with `--loss chunked`. "
           f"Command: `PYTHONPATH=src .venv/bin/python bench/architecture_sweep.py --only "
           f"{','.join(r['model_type'] for r in data['rows'])} --cases {st.get('cases', 'grid')} --loss chunked "
           f"--jobs 2 --out bench/results/architecture_sweep_chunked.json` on {data['machine']['cpu_model']} "
           f"({data['machine']['cpu_cores']} cores, load {data['machine']['load_average_1m_at_start']:.1f}).", "",
           f"{sm['planned']} families ({sm['traced']} traced), {sm['cases']} cases, parameters exact in "
           f"{sm['params_exact']}: median |error| {100 * (sm['median_abs_error'] or 0):.1f}%, largest over "
           f"{100 * (sm['max_over'] or 0):+.1f}%, largest under {100 * (sm['max_under'] or 0):+.1f}%"
           + (f"; refused: {', '.join(refused)}" if refused else "") + ".", "",
           "| family | cases (error of the allocated peak) |", "|---|---|"]
    for r in data["rows"]:
        if "cases" in r:
            out.append(f"| {r['model_type']} | " + ", ".join(
                f"{c['method']}{' ckpt' if c['grad_ckpt'] else ''} "
                + (f"{100 * c['error']:+.1f}%" if "error" in c else "refused") for c in r["cases"]) + " |")
    return "\n".join(out)


def bench_plan() -> str:
    files = sorted(RESULTS.glob("bench_plan-*.json"))
    if not files:
        return "_no benchmark recorded yet_"
    out = []
    for f in files:
        d = json.loads(f.read_text())
        m = d["machine"]
        out += [f"`{f.name}` ({m['cpu_model']}, {m['cpu_cores']} cores, load {m['load_average_1m_at_start']:.1f}); "
                f"command: `python bench/bench_plan.py`", "",
                "| what | median | target |", "|---|---:|---:|",
                f"| `{d['cli_plan']['command']}` (whole process) | {d['cli_plan']['median_seconds'] * 1000:.0f} ms "
                f"| well under 1 s |",
                f"| one memory + time estimate ({d['estimate']['setup']}) | "
                f"{d['estimate']['memory_plus_time_median_us']:.0f} µs | < 1 ms |"]
        for p in d["planner_search"]:
            out.append(f"| planner search: {p['model']} {p['method']} on {p['gpus']}, effective batch "
                       f"{p['effective_batch']} → {p['chosen']} | {p['median_ms']:.1f} ms | < 50 ms |")
        out.append("")
    return "\n".join(out).rstrip()


def bench_ui() -> str:
    """The monitor's sampling cost and the wizard's paint/recompute times."""
    out = ["| what | measured | target | file |", "|---|---:|---:|---|"]
    for f in sorted(RESULTS.glob("bench_sampler-*.json")):
        d = json.loads(f.read_text())
        out.append(f"| monitor sampling at {d['interval_seconds']:.0f} Hz ({d['gpus_sampled']} GPUs via "
                   f"{d['nvml']}, {d['rank_processes_sampled']} rank processes, {d['log_files_tailed']} logs) | "
                   f"{100 * d['sampler_thread_core_fraction']:.2f}% of a core | "
                   f"< {100 * d['target_core_fraction']:.0f}% | `{f.name}` |")
    for f in sorted(RESULTS.glob("bench_wizard-*.json")):
        d = json.loads(f.read_text())
        fp = d["first_paint_terminal"]["seconds"]
        out.append(f"| wizard first paint in tmux (process start included), median / max | "
                   f"{fp['median']:.2f} s / {fp['max']:.2f} s | < {d['first_paint_terminal']['target_seconds']:.0f} s "
                   f"| `{f.name}` |")
        for case, r in d.get("recompute_per_key", {}).items():
            ui = r["ui_thread_engine_and_widget_updates_seconds"]
            out.append(f"| wizard what-if key, engine + widget updates ({case}), median / p95 | "
                       f"{1000 * ui['median']:.1f} ms / {1000 * ui['p95']:.1f} ms | < 16 ms | `{f.name}` |")
    for f in sorted(RESULTS.glob("telemetry_cost-*.json")):
        d = json.loads(f.read_text())
        out.append(f"| per-rank telemetry in the trainer (phases, NVML {d['nvml']}, {d['vector_floats']} floats "
                   f"gathered), per step vs the CPU demo's {1000 * d['demo_steady_step_seconds']:.0f} ms step | "
                   f"{1e6 * d['telemetry_seconds_per_step']:.0f} µs = {100 * d['fraction_of_step']:.2f}% | "
                   f"≤ {100 * d['target_fraction']:.0f}% | `{f.name}` |")
    return "\n".join(out) + ("\n\nCommands: `python bench/bench_sampler.py`, `python bench/bench_wizard.py`, "
                             "`python bench/telemetry_cost.py` (AMD EPYC, 2 cores).")


def gpu_accuracy() -> str:
    """The H100 records re-predicted by the current model (bench/gpu_records.py writes the file)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_records import table

    return table(json.loads((RESULTS / "h100-2026-11-23.json").read_text()))


def host_overhead() -> str:
    """The bundled trainer against a plain PyTorch loop (bench/host_overhead.py), and the ops each loop dispatches
    (bench/kernel_counts.py)."""
    d = json.loads((RESULTS / "host_overhead-vm.json").read_text())
    m = d["machine"]
    out = [f"`host_overhead-vm.json` ({m['cpu_model']}, {m['cpu_cores']} cores, load {m['load_average_1m_at_start']:.1f}"
           f" at start, {m['load_average_1m_at_end']:.1f} at end); command: `{d['command'].replace('.venv/bin/', '')}`"
           f"; preset {d['preset']}, {d['steps']} steps, the first {d['warmup_steps_dropped']} dropped", "",
           "| processes | threads each | trainer tok/s | plain loop tok/s | trainer ÷ plain (median of pairs, min–max) "
           "| CPU per step on one thread, plain ÷ trainer | target |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for c in d["cases"]:
        threads = c["pairs"][0]["trainer"]["threads_per_process"]
        out.append(f"| {c['processes']} | {threads} | {c['trainer_tokens_per_second_median']:,.0f} | "
                   f"{c['plain_tokens_per_second_median']:,.0f} | {c['ratio_median']:.3f} ({c['ratio_min']:.2f}–"
                   f"{c['ratio_max']:.2f}) | {c['cpu_ratio_median']:.3f} ({c['cpu_ratio_min']:.2f}–"
                   f"{c['cpu_ratio_max']:.2f}) | ≥ {c['target']} |")
    k = json.loads((RESULTS / "kernel_counts-vm.json").read_text())
    loops = list(k["cases"][0]["counts"])
    out += ["", "Ops dispatched per optimizer step (`python bench/kernel_counts.py`, torch.profiler, one thread):", "",
            "| case | " + " | ".join(loops) + " |", "|---|" + "---:|" * len(loops)]
    for c in k["cases"]:
        out.append(f"| {c['case']}, micro {c['micro_batch']} × seq {c['seq_len']}, accumulation {c['grad_accum']} | "
                   + " | ".join(f"{c['counts'][lp]['dispatched']:,}" for lp in loops) + " |")
    return "\n".join(out)


def trace_latency() -> str:
    data = json.loads((RESULTS / "trace_latency-vm.json").read_text())
    m = data["machine"]
    out = ["| model | first plan, `scaletrain plan` (cold) | first plan after the wizard's warm-up | cached plan, "
           "`scaletrain plan` | cached, in the wizard's process |", "|---|---:|---:|---:|---:|"]
    sec = lambda x: "—" if x is None else f"{x:.2f} s"     # noqa: E731
    for r in data["rows"]:
        out.append(f"| {r['model']} | {sec(r['first_median'])} | {sec(r.get('first_after_warm_up_median'))} | "
                   f"{sec(r['cached_median'])} | {sec(r.get('in_process_cached_median'))} |")
    out += ["", f"Medians of {len(data['rows'][0]['first_plan_seconds'])} runs each, `python bench/trace_latency.py` "
                f"({m['cpu_model']}, {m['cpu_cores']} cores, 1-minute load {m['load_average_1m_at_start']:.1f} at "
                f"the start{_end_load(data)}). tiny-llama is analytic (no trace)."]
    return "\n".join(out)


def _end_load(data: dict) -> str:
    end = data.get("load_average_1m_at_end")
    return "" if end is None else f", {end:.1f} at the end"


SECTIONS = {"architecture-sweep": architecture_sweep, "chunked-loss-sweep": chunked_loss_sweep,
            "trace-latency": trace_latency,
            "cpu-groundtruth": cpu_groundtruth, "gpu-accuracy": gpu_accuracy, "bench-plan": bench_plan,
            "bench-ui": bench_ui, "host-overhead": host_overhead}


def pages() -> list[Path]:
    """The files that may hold marked sections: README.md and the docs site's pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def section_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Regenerate the docs' measured tables from bench/results/*.json.")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 naming each page whose tables differ from what the results give")
    args = ap.parse_args(argv)
    bodies: dict[str, str] = {}
    stale: list[str] = []
    for page in pages():
        text = original = page.read_text()
        for name, fn in SECTIONS.items():
            pat = section_pattern(name)
            if not pat.search(text):
                continue
            if name not in bodies:
                try:
                    bodies[name] = fn()
                except FileNotFoundError:
                    continue
            text = pat.sub(lambda m: m.group(1) + bodies[name] + "\n" + m.group(2), text)
        if text == original:
            continue
        if args.check:
            changed = [n for n in SECTIONS if (a := section_pattern(n).search(original)) is not None
                       and a.group(0) != section_pattern(n).search(text).group(0)]
            stale.append(f"{page.relative_to(ROOT)}: {', '.join(changed)}")
            continue
        tmp = page.with_suffix(".md.tmp")
        tmp.write_text(text)
        os.replace(tmp, page)
    if stale:
        print("tables not regenerated from bench/results (run python bench/readme_tables.py): " + "; ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
