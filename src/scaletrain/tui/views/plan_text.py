"""Plan → short rich lines for the wizard's panels. Formatting only: every number is read from the Plan."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.rows import AlternativeRow
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run.run_length import run_length
from scaletrain.engine.units import fmt_bytes, fmt_count, fmt_seconds



def model_line(plan: Plan) -> Text:
    s = plan.setup
    method = s.method if s.method == "full" else f"{s.method} r={s.lora_rank}, {s.base_bits}-bit base"
    res = "".join(f" + {r.model.name} ({r.bits}-bit, resident)" for r in s.residents)
    return Text.assemble((s.model.name, "bold"), f"  {fmt_count(s.model.params)} params, "
                         f"{fmt_count(s.trainable_params)} trainable ({method}){res}")


def hardware_line(plan: Plan) -> Text:
    hw = plan.setup.hardware
    where = "detected" if hw.source == "detected" else "planned"
    return Text.assemble((hw.describe(), "bold"), f"  {hw.gpu.name}, {hw.memory_text()}, "
                         f"{hw.gpu.interconnect} ({where})")


def batch_line(plan: Plan) -> Text:
    s = plan.setup
    return Text.assemble("micro ", (str(s.micro_batch), "bold"), " × accum ", (str(s.grad_accum), "bold"),
                         f" × {s.hardware.devices_text()} = ", (str(s.effective_batch), "bold cyan"), " effective")


def objective_line(plan: Plan) -> Text:
    """'objective: grpo, 8 completions per prompt, prompt 512 + completion 512, reference none, generation train'."""
    s = plan.setup
    obj = s.objective
    if obj == "reward":
        what = f"reward model: {s.micro_batch} pairs per micro-step = {s.sequences_per_micro} sequences of {s.seq_len}"
    elif obj == "dpo":
        what = (f"dpo: {s.micro_batch} pairs per micro-step = {s.sequences_per_micro} sequences, prompt "
                f"{s.prompt_len} + completion {s.completion_len}, reference {s.ref_model}")
    elif obj == "grpo":
        what = (f"grpo: {s.micro_batch} completions per micro-step, {s.num_generations} per prompt, prompt "
                f"{s.prompt_len} + completion {s.completion_len}, reference {s.ref_model}, generation {s.generation}")
    else:
        what = "sft"
    return Text.assemble("objective: ", (what, "bold"))


def setup_line(plan: Plan) -> Text:
    s = plan.setup
    parts = [s.strategy.label]
    parts.append("no offload" if s.offload == "none" else f"offload {s.offload}")
    parts.append(f"grad-ckpt {'on' if s.grad_ckpt else 'off'}")
    parts += [s.precision_label, s.optimizer_label, f"attn {s.attn}", f"seq {s.seq_len}"]
    if s.loop != "trainer":   # the numbers are for another loop than the bundled trainer's
        parts.append(f"loop {s.loop}")
    if s.loss == "chunked":
        parts.append("loss chunked")
    return Text(" · ".join(parts))


def loop_words(s: Any) -> str:
    """'loop trainer (the bundled trainer's loop)': which loop a TrainingSetup's numbers are for."""
    if s.objective != "sft":
        return f"loop {s.loop} (TRL's {s.objective} trainer)"
    return f"loop {s.loop} ({s.loop.words})"


def fit_line(plan: Plan) -> Text:
    m = plan.memory
    verdict = ("✓ fits", "bold green") if m.fits else ("✗ does not fit", "bold red")
    spare = (f"{fmt_bytes(m.headroom_bytes)} spare" if m.headroom_bytes >= 0
             else f"{fmt_bytes(-m.headroom_bytes)} over the card")
    return Text.assemble(verdict, f": {fmt_bytes(m.total_bytes)} per {plan.setup.hardware.device_noun} of "
                         f"{fmt_bytes(m.capacity_bytes)} "
                         f"(limit {fmt_bytes(m.usable_bytes)}, {spare})")


def time_line(plan: Plan, *, emphasis: bool = True) -> Text | None:
    """'time: 1.2 s/step, 5,120 tokens/s[, N steps/epoch, E/epoch][, T total]' (the CLI prints it unstyled)."""
    t = plan.time
    if t is None:
        return None
    bold = "bold" if emphasis else ""
    out = Text.assemble("time: ", (f"{fmt_seconds(t.step_seconds)}/step", bold), f", {t.tokens_per_second:,.0f} tokens/s")
    if t.steps_per_epoch and t.epoch_seconds is not None:
        out.append(f", {t.steps_per_epoch:,} step{'s' if t.steps_per_epoch != 1 else ''}/epoch, "
                   f"{fmt_seconds(t.epoch_seconds)}/epoch")
    if t.total_seconds:
        out.append(", ")
        out.append(f"{fmt_seconds(t.total_seconds)} total", style=bold)
    return out


def run_length_line(plan: Plan, train: TrainOptions) -> Text:
    """'runs: 200 steps (max_steps) = 6.45 epochs' — as the trainer will run it (engine.run.run_length)."""
    from scaletrain.engine.run.run_length import eval_cost

    ev = eval_cost(plan, train)
    return Text.assemble("runs: ", (run_length(plan, train).text(), "bold"), f"; {ev.text()}" if ev else "")


def run_time_line(plan: Plan, train: TrainOptions) -> Text | None:
    """'time: 8.8 s/step · 1.1 min/epoch · 2.1 min total · 0.0191 h per 1,000 samples' (engine.run.run_length)."""
    from scaletrain.engine.run.run_length import run_time

    rt = run_time(plan, train)
    if rt is None:
        return None
    words = rt.text().split(" · ")
    out = Text("time: ")
    for i, w in enumerate(words):
        if i:
            out.append(" · ")
        out.append(w, style="bold" if i == 0 or w.endswith(" total") else "")
    return out


def counted_line(plan: Plan, request: Any, train: TrainOptions) -> Text:
    """'runs: 2 epochs = 14 steps of 1,000 samples (the bundled data demo.jsonl, 1,000 rows; set the dataset for
    yours)' — the run as the trainer runs it and where its length comes from (engine.run.run_length)."""
    from scaletrain.engine.run.run_length import eval_cost, known_length

    known = known_length(request, train)
    n = plan.setup.dataset_size
    where = "" if n is None else f" of {n:,} samples" + ("" if known.source == "given" else f" ({known.source})")
    ev = eval_cost(plan, train)
    return Text.assemble("runs: ", (run_length(plan, train).text(), "bold"), where, f"; {ev.text()}" if ev else "")


def resource_lines(plan: Plan, train: TrainOptions, request: Any, run_dir: str | None = None) -> list[Text]:
    """Host RAM and disk beside the GPU fit line, and the verdict over all of them naming the binding one
    (engine.run.resources.resource_verdict); the disk checked where the run will be written (`run_dir`)."""
    from scaletrain.engine.run.resources import resource_verdict

    verdict = resource_verdict(plan, train, host_ram_gib=request.host_ram, run_dir=run_dir)
    out = [Text(f"  {c.line()}", style="red" if c.fits is False else "") for c in verdict.checks
           if c.key != "gpu_memory"]
    ok = verdict.fits
    out.append(Text.assemble(("verdict: ", "bold"), (verdict.line(), "bold green" if ok else "bold red")))
    return out


def lr_line(plan: Plan) -> Text | None:
    lr = plan.lr
    if lr is None:
        return None
    return Text.assemble(f"LR {lr.base_lr:g} @ batch {lr.base_batch} → {lr.effective_batch}: ",
                         ("√ rule ", "dim"), (f"{lr.sqrt_lr:.3g}", "bold"),
                         ("  linear rule ", "dim"), (f"{lr.linear_lr:.3g}", "bold"))


def why_lines(plan: Plan, explanation: str | None = None) -> list[Text]:
    """The planner's one-sentence explanation (or the given one) and the plan's notes (lr_line shows the LR)."""
    explanation = plan.explanation if explanation is None else explanation
    out = [Text(explanation, style="italic")] if explanation else []
    for note in plan.notes:
        if plan.lr is not None and note.startswith("learning rate"):
            continue
        out.append(Text.assemble(("note: ", "yellow"), note))
    return out


# the offloaded states in a row's strategy cell (the table's title says what they mean)
OFFLOAD_MARK = {"none": "", "optimizer": "+opt", "all": "+all"}


def alternative_row(row: AlternativeRow, plan: Plan | None = None) -> tuple[str, ...]:
    """One row of the planner's ranked alternatives (engine.plan.tables.rank_alternatives) and, beside the plan on
    screen, what that row changes (engine.plan.pins.row_versus; its own cells show what differs): 80 columns wide."""
    from scaletrain.engine.plan.pins import row_versus

    return (
        str(row.rank),
        row.strategy.label + OFFLOAD_MARK[row.offload],
        f"{row.micro_batch}×{row.grad_accum}",
        "on" if row.grad_ckpt else "off",
        fmt_bytes(row.per_gpu_bytes),
        fmt_seconds(row.step_seconds),
        fmt_seconds(row.epoch_seconds) if row.epoch_seconds else "–",
        row_versus(row, plan, named=False) if plan is not None else "",
    )


# 80 columns hold every cell: "batch" is micro×accum, and the last column says what a row changes only (its own cells
# show what differs)
def alternative_columns(plan: Plan | None) -> tuple[str, ...]:
    """The alternatives' headers; the memory column says what one rank runs on ("per process" on a CPU plan)."""
    noun = plan.setup.hardware.device_noun if plan is not None else "GPU"
    return ("#", "strategy", "batch", "ckpt", f"per {noun}", "step", "epoch", "vs the plan above")


ALTERNATIVES_TITLE = "alternatives (enter picks; +opt/+all: optimizer/all states offloaded)"
