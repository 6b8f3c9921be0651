"""Step 1: the GPUs — what NVML found here, or hardware from the catalog to plan for; nodes."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, OptionList, RadioButton, RadioSet, Static
from textual.widgets.option_list import Option

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import CPU_DEVICE, INTER_NODE_LINKS, GpuSpec, inter_node_gbit_s
from scaletrain.engine.devices.nvml import DetectionResult
from scaletrain.engine.units import fmt_bytes
from scaletrain.tui.wizard.screen_base import WizardStep
from scaletrain.tui.widgets.field import Field
from scaletrain.tui.wizard.state import (WizardState, catalog_gpus, field_value, hardware_for, parse_float,
                                         parse_int)


def describe_detection(res: DetectionResult | None) -> Text:
    """What NVML said, in plain words (the reason when nothing was found)."""
    if res is None:
        return Text("Detecting GPUs with NVML…", style="italic")
    if not res.gpus:
        return Text.assemble(
            ("No GPU detected on this machine", "bold yellow"), f" ({res.error or 'none visible'}).\n",
            "Plan for hardware from the catalog below; the run directory can be copied to that machine.")
    t = Text.assemble((f"Detected {len(res.gpus)} GPU(s)", "bold green"),
                      f" · driver {res.driver_version or 'N/A'} · CUDA {res.cuda_driver_version or 'N/A'}")
    for g in res.gpus:
        mem = fmt_bytes(g.memory_total_bytes) if g.memory_total_bytes else "N/A"
        mig = "" if not g.mig_enabled else " · MIG on"
        t.append(f"\n  {g.index}: {g.name or 'N/A'} · {mem} · {g.interconnect}{mig}")
    return t


def _link_names() -> str:
    """'edr, hdr, ndr, xdr, 10gbe … 400gbe': the CLI's link names (catalog.hardware.INTER_NODE_LINKS), short."""
    ib = [k for k in INTER_NODE_LINKS if not k.endswith("gbe")]
    eth = [k for k in INTER_NODE_LINKS if k.endswith("gbe")]
    return ", ".join(ib) + (f", {eth[0]} … {eth[-1]}" if eth else "")


def _headroom(text: str) -> float:
    v = parse_float(text, "headroom", positive=False)
    if not 0.0 <= v < 1.0:
        raise ScaletrainError(f"headroom is the share of each card kept free: a fraction in [0, 1) (got {v:g})")
    return v


def _gpu_option(g: GpuSpec) -> Option:
    mem = "host RAM" if g.key == CPU_DEVICE.key else fmt_bytes(g.memory_bytes)
    return Option(Text.assemble((f"{g.key:<10}", "bold"), f" {g.name:<32} {mem:>11}  {g.interconnect}"), id=g.key)


class HardwareScreen(WizardStep):
    STEP = 1
    HELP = """
## Step 1 · Hardware
Choose what the plan runs on. **Detected** uses the GPUs NVML sees on this machine (name, memory, count, link,
driver); **catalog** plans for named hardware (e.g. 4×H200) — use it to plan a run for another machine, or when
there is no GPU here. Set GPUs per node and the number of nodes, the **headroom** (the share of each card the plan
keeps free, 0.10 by default) and the **inter-node link** of a multi-node plan (Gb/s, or a name: edr, hdr, ndr, xdr,
10gbe … 400gbe; empty: one HDR InfiniBand port). `ctrl+n` checks the choice and moves on.
"""

    def body(self) -> ComposeResult:
        st = self.wizard.state
        key, per_node, nodes = st.catalog_choice()
        with VerticalScroll(id="body"):
            yield Static(describe_detection(self.wizard.detection), id="detected")
            with RadioSet(id="source"):
                yield RadioButton("GPUs detected here", id="src-detected",
                                  value=st.hw_source == "detected", disabled=not self._has_gpus())
                yield RadioButton("hardware from the catalog", id="src-catalog", value=st.hw_source == "catalog")
            yield Static("", id="hw-summary")
            with Vertical(id="catalog-box"):
                yield OptionList(*[_gpu_option(g) for g in catalog_gpus()], id="catalog")
            with Horizontal(id="counts"):
                yield Field("per_node", "GPUs per node", str(per_node), hint="1–64 (CPU: processes)")
                yield Field("nodes", "nodes", str(nodes), hint="machines alike")
            with Horizontal(id="settings"):
                req = st.request
                yield Field("headroom", "headroom", f"{req.headroom:g}", hint="share of each card kept free")
                yield Field("link", "inter-node link", "" if req.inter_node_gbps is None else f"{req.inter_node_gbps:g}",
                            placeholder="hdr (200)", hint=f"Gb/s or {_link_names()}")

    def on_mount(self) -> None:
        key, _, _ = self.wizard.state.catalog_choice()
        cat = self.query_one("#catalog", OptionList)
        cat.highlighted = cat.get_option_index(key)
        self._sync_source()
        self.query_one("#source" if self._has_gpus() else "#catalog").focus()
        self.refresh_summary()
        if self.wizard.detection is not None:   # detection finished before this step opened (the start screen)
            self.refresh_detection()

    def _has_gpus(self) -> bool:
        det = self.wizard.detection
        return bool(det and det.gpus)

    def _source(self) -> str:
        return "detected" if self.query_one("#src-detected", RadioButton).value else "catalog"

    def _sync_source(self) -> None:
        catalog = self._source() == "catalog"
        self.query_one("#catalog-box").set_class(not catalog, "-disabled")
        self.query_one("#field-per_node", Field).set_class(not catalog, "-disabled")
        self.query_one("#in-per_node", Input).disabled = not catalog
        self.query_one("#catalog", OptionList).disabled = not catalog

    # ---- detection arrives from the app's thread worker ------------------------------------------------------
    def refresh_detection(self) -> None:
        det = self.wizard.detection
        self.query_one("#detected", Static).update(describe_detection(det))
        src = self.query_one("#src-detected", RadioButton)
        src.disabled = not self._has_gpus()
        offer_catalog = self.wizard.state.hw_source == "detected" and not self._has_gpus()
        if self.wizard.state.hw_source == "detected":
            src.value = self._has_gpus()   # now, not when the set's own message arrives: the catalog is enabled
        if offer_catalog:                  # asked for auto, found nothing: say so (above) and offer the catalog
            self.query_one("#src-catalog", RadioButton).value = True
        self._sync_source()
        if offer_catalog:                  # focused once enabled (a disabled list refuses it: the body took it)
            self.query_one("#catalog", OptionList).focus()
        self.refresh_summary()

    # ---- live summary ----------------------------------------------------------------------------------------
    @on(RadioSet.Changed, "#source")
    def _source_changed(self) -> None:
        self._sync_source()
        self.refresh_summary()

    @on(OptionList.OptionHighlighted, "#catalog")
    @on(Input.Changed)
    def _changed(self) -> None:
        self.refresh_summary()

    @on(OptionList.OptionSelected, "#catalog")
    def _picked(self) -> None:
        self.query_one("#in-per_node", Input).focus()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "in-link":
            self.action_next()
        else:
            self.focus_next()

    def candidate(self) -> WizardState:
        """The state these widgets describe; FieldError names a bad field."""
        headroom = field_value(self.query_one("#field-headroom", Field), _headroom)
        link = field_value(self.query_one("#field-link", Field),
                           lambda t: inter_node_gbit_s(t.strip()) if t.strip() else None)
        st = self.wizard.state.with_request(headroom=headroom, inter_node_gbps=link)
        nodes = field_value(self.query_one("#field-nodes", Field), lambda t: parse_int(t, "nodes"))
        if self._source() == "detected":
            return st.with_detected_hardware(nodes)
        opt = self.query_one("#catalog", OptionList).highlighted_option
        if opt is None or opt.id is None:
            raise ScaletrainError("pick a GPU from the catalog list")
        per_node = field_value(self.query_one("#field-per_node", Field), lambda t: parse_int(t, "GPUs per node"))
        return st.with_catalog_hardware(opt.id, per_node, nodes)

    def refresh_summary(self) -> None:
        """Re-resolve the hardware through the engine on every change; refusals appear in place."""
        summary = self.query_one("#hw-summary", Static)
        self.clear_field_errors()
        try:
            hw = hardware_for(self.candidate(), self.wizard.detection)
        except ScaletrainError as e:
            self.show_field_error(e)
            summary.update(Text(f"✗ {e}", style="bold red"))
            return
        mem = hw.memory_text()
        where = "detected here" if hw.source == "detected" else "planned from the catalog"
        summary.update(Text.assemble(("→ ", "bold"), (hw.describe(), "bold"),
                                     f": {hw.gpu.name}, {mem}, {hw.gpu.interconnect}; "
                                     f"{hw.world_size} process{'es' if hw.world_size != 1 else ''} in all "
                                     f"({where})"))

    def action_next(self) -> None:
        try:
            state = self.candidate()
            hardware_for(state, self.wizard.detection)
        except ScaletrainError as e:
            self.refuse(e)
            return
        self.set_status(None)
        self.wizard.advance(state, self.STEP)
