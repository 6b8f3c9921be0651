"""The package's shape: no import cycle, declared layers that import only downwards, no module over MAX_LINES and
no function over MAX_FUNCTION_LINES, no import of another module's `_private` name, NVML only behind
devices/nvml.py, and the headless part free of Textual and Rich (and of torch: the engine plans without it, the
trainer imports it inside functions).

The import graph is read from the source with `ast`: every `import` and `from ... import` inside the package,
at module level and inside functions, is an edge to the module it names (`from pkg import name` names
`pkg.name` when that is a module, else `pkg`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import scaletrain

ROOT = Path(scaletrain.__file__).resolve().parent
PACKAGE = "scaletrain"
MAX_LINES = 500
MAX_FUNCTION_LINES = 100
# Modules that must load without Textual or Rich (the engine, the trainer, the bundled presets).
HEADLESS = ("scaletrain.engine", "scaletrain.trainer", "scaletrain.presets")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_pkg = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
            for t in targets:
                while t and t not in MODULES and "." in t:
                    t = t.rsplit(".", 1)[0]      # `import a.b.c` of a package attribute: its module
                if t in MODULES and t != module:
                    graph[module].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    color = {m: WHITE for m in graph}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        color[m] = GREY
        stack.append(m)
        for n in sorted(graph[m]):
            if color[n] == GREY:
                return stack[stack.index(n):] + [n]
            if color[n] == WHITE and (c := visit(n)):
                return c
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(graph):
        if color[m] == WHITE and (c := visit(m)):
            return c
    return None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_the_limit(module):
    n = len(MODULES[module].read_text().splitlines())
    assert n <= MAX_LINES, f"{MODULES[module]} has {n} lines (limit {MAX_LINES}): split it by what it does"


def test_headless_modules_import_neither_textual_nor_rich_nor_torch():
    names = [m for m in MODULES if m.startswith(HEADLESS)]
    code = ("import importlib, sys\n"
            f"for m in {names!r}:\n"
            "    importlib.import_module(m)\n"
            "print(sorted(m for m in ('textual', 'rich', 'torch', 'transformers') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    assert len(names) > 60


# ---- layers ------------------------------------------------------------------------------------------------------
# Each unit is an engine module at the top of the engine (engine.errors), an engine or tui sub-package
# (engine.plan, tui.wizard), or a top-level package (trainer, presets). A unit imports only units of a LOWER layer
# (and itself): the engine from the bottom up, then the trainer, then the front ends, then the package's entry.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("engine.errors",),
    ("engine.vocabulary", "engine.units", "engine.fileio", "engine.yamlsafe", "engine.probes", "presets"),
    ("engine.choices",),
    ("engine.catalog",),
    ("engine.devices", "engine.model"),
    ("engine.request",),
    ("engine.plan",),
    ("engine.run",),
    ("engine.launch",),
    ("engine.sampling",),
    ("engine.doctor",),
    ("engine",),
    ("trainer",),
    ("measure",),
    ("tui.views",),
    ("tui.widgets",),
    ("tui.monitor",),
    ("tui.wizard",),
    ("tui.cli",),
    ("tui",),
    ("",),
)
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """scaletrain.engine.plan.planner → engine.plan; scaletrain.engine.errors → engine.errors; scaletrain.trainer.x
    → trainer; scaletrain → "" (the package itself)."""
    parts = module.split(".")[1:]
    if parts[:1] in (["engine"], ["tui"]) and len(parts) >= 2:
        return ".".join(parts[:2])
    return ".".join(parts[:1])


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        a = unit_of(module)
        for t in sorted(targets):
            b = unit_of(t)
            if a != b and not LAYER[b] < LAYER[a]:
                out.append(f"{module} ({a}) imports {t} ({b}): a layer imports only from the layers below it")
    return out


def test_every_module_has_a_declared_layer():
    missing = sorted({unit_of(m) for m in MODULES} - set(LAYER))
    assert not missing, f"units with no layer in LAYERS: {missing}"


def test_layers_import_only_downwards():
    bad = layer_violations(import_graph())
    assert not bad, "\n".join(bad)


def test_the_layer_check_fails_when_broken():
    """An engine module importing the tui, or the plan importing the run directory, is refused."""
    graph = {"scaletrain.engine.plan.planner": {"scaletrain.engine.run.writers", "scaletrain.engine.model.memory"},
             "scaletrain.engine.run.writers": {"scaletrain.tui.views.render"},
             "scaletrain.tui.views.render": {"scaletrain.engine.plan.planner"}}
    bad = layer_violations(graph)
    assert len(bad) == 2
    assert "planner (engine.plan) imports scaletrain.engine.run.writers (engine.run)" in bad[0]
    assert "writers (engine.run) imports scaletrain.tui.views.render (tui.views)" in bad[1]


# ---- private names, NVML, function length ------------------------------------------------------------------------
def private_imports() -> list[str]:
    """`from scaletrain.x import _name` anywhere in the package: another module's private name."""
    out = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and _resolve(module, node).startswith(PACKAGE):
                out += [f"{module} imports {_resolve(module, node)}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_module_imports_another_modules_private_name():
    bad = private_imports()
    assert not bad, "\n".join(bad)


def test_nvml_is_only_behind_devices_nvml():
    users = sorted(m for m, path in MODULES.items()
                   if m != f"{PACKAGE}.engine.devices.nvml" and ("pynvml" in path.read_text()
                                                                or "nvmlDevice" in path.read_text()))
    assert not users, f"NVML used outside engine/devices/nvml.py: {users}"


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    out = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path}:{node.lineno} {node.name} has {n} lines (limit {limit})")
    return out


def test_no_function_over_the_limit():
    bad = long_functions()
    assert not bad, "split by what it does:\n" + "\n".join(bad)


def test_the_run_directorys_file_names_are_spelled_in_its_layout_only():
    """plan.json, status.json, launch.sh …: every module names them through engine/run/layout.py (RunDir and its
    constants); a message may mention one, a path or a list may not spell it again."""
    from scaletrain.engine.run.layout import LAYOUT_NAMES

    files = {n for n in LAYOUT_NAMES if "." in n}
    owner = f"{PACKAGE}.engine.run.layout"
    spelled = sorted(f"{m}:{n.lineno} {n.value}" for m, path in MODULES.items() if m != owner
                     for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and n.value in files)
    assert not spelled, "\n".join(spelled)
