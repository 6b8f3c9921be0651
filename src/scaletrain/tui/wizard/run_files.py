"""The write step's engine calls: preview the run directory's files, write them, save a preset.

No Textual here (the plain wizard uses it too).
"""

from __future__ import annotations

from pathlib import Path

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.request.presets import write_preset
from scaletrain.engine.run.layout import WRITTEN, RunDir, default_run_dir
from scaletrain.engine.run import writers
from scaletrain.tui.wizard.state import WizardState

# Order in which the write step lists files (the rest follow alphabetically).


def default_dir(state: WizardState) -> str:
    return state.run_dir or str(default_run_dir(state.request.name or "plan"))


def _ordered(files: dict[str, str]) -> dict[str, str]:
    known = [n for n in WRITTEN if n in files]
    return {n: files[n] for n in known + sorted(n for n in files if n not in WRITTEN)}


def preview(plan: Plan, state: WizardState, run_dir: str) -> dict[str, str]:
    """The files `write` would create in `run_dir`, name → text, rendered by the writers without touching disk."""
    train = writers.checked_train(state.train, objective=state.request.objective)
    files = writers.render_run_files(plan, state.request, train, RunDir(Path(run_dir or ".").expanduser()),
                                     job_specs=state.job_specs)
    return _ordered({name: text for name, (text, _mode) in files.items()})


def write(plan: Plan, state: WizardState, run_dir: str, *, overwrite: bool = False) -> RunDir:
    """Write the run directory (the writers refuse to clobber a different plan, in one line, unless overwrite)."""
    if not run_dir.strip():
        raise ScaletrainError("the run directory is empty; give a folder to write the run into")
    try:
        return writers.write_run_dir(plan, state.request, state.train, Path(run_dir).expanduser(), overwrite=overwrite,
                                     job_specs=state.job_specs)
    except OSError as e:
        raise ScaletrainError(f"cannot write {run_dir}: {e.strerror or e}; choose another run directory") from None


def written_files(run: RunDir) -> dict[str, str]:
    """What is on disk now, name → text, in the order the write step lists files."""
    return _ordered({p.name: p.read_text() for p in writers.written_files(run) if p.is_file()})


def save_preset(name: str, state: WizardState, plan: Plan | None = None) -> tuple[Path, Path | None]:
    """Save the wizard's choices as a preset YAML (with a plan: its choices pinned), written atomically; a different
    file of that name is copied aside first. Returns (where it went, the backup or None)."""
    if not name.strip():
        raise ScaletrainError("preset name is empty; give a name like my-h200-lora")
    if not state.request.model:
        raise ScaletrainError("no model chosen yet: a preset needs one; pick it on step 2, then save")
    path, backup = write_preset(name.strip(), state.request, state.train, plan=plan)
    return Path(path), backup
