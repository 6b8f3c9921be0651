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
import functools
import subprocess
import sys
from pathlib import Path

import pytest

import scaletrain

ROOT = Path(scaletrain.__file__).resolve().parent
BENCH = ROOT.parents[1] / "bench"
PACKAGE = "scaletrain"
MAX_LINES = 500
MAX_FUNCTION_LINES = 100
# Modules that must load without Textual or Rich (the engine, the trainer, the measuring room, the bundled presets).
HEADLESS = ("scaletrain.engine", "scaletrain.trainer", "scaletrain.measure", "scaletrain.presets")
# Modules the engine starts as processes (`python -m`, by a module string it holds): the trainer's entry, accelerate's
# launcher and the probes' (engine/run/scripts.py TRAINER_MODULE and ACCELERATE_LAUNCH_MODULE, engine/probes.py
# PROBE_MODULE). A process boundary, so the one edge that may point up; every other module string the source names
# is an edge like an import.
ENTRY_POINTS = frozenset({"scaletrain.trainer.train", "scaletrain.trainer.launch_agent", "scaletrain.measure.probe"})


def modules_under(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package at `root` by dotted name (a package by its __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def bench_modules(root: Path = BENCH) -> dict[str, Path]:
    """bench/'s scripts as modules `bench.NAME` (they import each other by bare name, bench/ on sys.path)."""
    return {f"bench.{p.stem}": p for p in sorted(root.glob("*.py"))}


MODULES = modules_under(ROOT)
ALL_MODULES = {**MODULES, **bench_modules()}


def _resolve(module: str, node: ast.ImportFrom, modules: dict[str, Path] = ALL_MODULES) -> str:
    if not node.level:
        return node.module or ""
    is_pkg = modules[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _edges(module: str, tree: ast.AST, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(imports, runs) of one module: every `import`/`from … import` of a module of the package or bench, and
    every string constant that is exactly a module's dotted name (what `python -m` is given)."""
    imports: set[str] = set()
    runs: set[str] = set()
    docs = _docstrings(tree)
    bench_sibling = module.startswith("bench.")
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node, modules)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and node.value in modules and node.value.startswith(PACKAGE + "."):
            runs.add(node.value)
        for t in targets:
            if bench_sibling and f"bench.{t}" in modules:
                t = f"bench.{t}"                 # bench/'s scripts import each other by bare name
            while t and t not in modules and "." in t:
                t = t.rsplit(".", 1)[0]      # `import a.b.c` of a package attribute: its module
            if t in modules and t != module:
                imports.add(t)
    runs.discard(module)
    return imports, runs


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.AST:
    """A module's syntax tree, parsed once per test process: the checks here walk every module, several times each
    (read only: no check changes a tree)."""
    return ast.parse(path.read_text(), str(path))


_REAL_GRAPHS: list[tuple[dict[str, set[str]], dict[str, set[str]]]] = []


def graphs(modules: dict[str, Path] = ALL_MODULES) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(imports, runs): the import graph, and the module strings each module names (its `python -m` edges); the real
    tree's once per test process."""
    if modules is ALL_MODULES:
        if not _REAL_GRAPHS:
            _REAL_GRAPHS.append(_graphs(modules))
        return _REAL_GRAPHS[0]
    return _graphs(modules)


def _graphs(modules: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    imports: dict[str, set[str]] = {}
    runs: dict[str, set[str]] = {}
    for module, path in modules.items():
        imports[module], runs[module] = _edges(module, parsed(path), modules)
    return imports, runs


def import_graph(modules: dict[str, Path] = ALL_MODULES) -> dict[str, set[str]]:
    """Imports and `python -m` edges together, less the edges into the entry points (process boundaries)."""
    imports, runs = graphs(modules)
    return {m: imports[m] | {t for t in runs[m] if t not in ENTRY_POINTS} for m in modules}


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


def folder_graph(graph: dict[str, set[str]], modules: dict[str, Path] = ALL_MODULES) -> dict[str, set[str]]:
    """The import graph between folders (each module's package; a package's __init__ is its own folder)."""
    def folder(m: str) -> str:
        return m if m in modules and modules[m].name == "__init__.py" else m.rsplit(".", 1)[0]

    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(folder(m), set())
        for t in targets:
            out.setdefault(folder(t), set())
            if folder(t) != folder(m):
                out[folder(m)].add(folder(t))
    return out


def test_no_folder_level_import_cycle():
    """No folder imports a folder that imports it back, at any depth (trainer/ and its sub-folders included)."""
    cycle = find_cycle(folder_graph(import_graph()))
    assert cycle is None, "folder-level import cycle: " + " → ".join(cycle or [])


def test_the_folder_cycle_check_fails_on_a_sub_folder_that_climbs_back():
    """trainer/objectives importing trainer/model while trainer/train imports trainer/objectives (the tree before
    the objectives moved beside the loop): a cycle of folders, though no module imports itself back."""
    graph = {"scaletrain.trainer.train": {"scaletrain.trainer.objectives.run"},
             "scaletrain.trainer.objectives.run": {"scaletrain.trainer.objectives.build"},
             "scaletrain.trainer.objectives.build": {"scaletrain.trainer.model"}, "scaletrain.trainer.model": set()}
    assert find_cycle(graph) is None                           # no module-level cycle …
    assert find_cycle(folder_graph(graph)) == ["scaletrain.trainer", "scaletrain.trainer.objectives",
                                               "scaletrain.trainer"]   # … but the folders climb back


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
# Each declared unit is an engine module at the top of the engine (engine.errors), an engine or tui sub-package
# (engine.plan, tui.wizard), a top-level package (trainer, measure, presets), the package itself (""), or bench/.
# A unit imports only units of a LOWER layer (and itself): the engine from the bottom up, then the trainer, the
# measuring room, the front ends, the package's entry, and the benchmarks on top. A folder below a declared unit
# (trainer/sub/) is a room of its unit's floor: its folder may import it, it never imports an ancestor folder, and
# the rooms import each other without a cycle (test_no_folder_level_import_cycle).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("engine.errors",),
    ("engine.vocabulary", "engine.units", "engine.fileio", "engine.yamlsafe", "engine.probes", "engine.dist_versions",
     "engine.startup", "presets"),
    ("engine.choices",),
    ("engine.catalog",),
    ("engine.devices", "engine.estimate"),
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
    ("bench",),
)
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str, modules: dict[str, Path] = ALL_MODULES) -> str:
    """The folder a module lives in, under the package: scaletrain.engine.plan.planner → engine.plan,
    scaletrain.trainer.x → trainer, scaletrain.trainer.sub.x → trainer.sub, scaletrain → "" (the package itself),
    bench.accuracy → bench; a module at the top of the engine is a unit of its own (engine.errors)."""
    if module.startswith("bench."):
        return "bench"
    parts = module.split(".")[1:]
    is_pkg = module in modules and modules[module].name == "__init__.py"
    folder = parts if is_pkg else parts[:-1]
    if folder == ["engine"] and not is_pkg:
        return f"engine.{parts[-1]}"
    return ".".join(folder)


def declared_unit(unit: str) -> str:
    """The declared unit a folder belongs to: engine.plan.sub → engine.plan, trainer.sub → trainer."""
    parts = unit.split(".") if unit else []
    return ".".join(parts[:2] if parts[:1] in (["engine"], ["tui"]) else parts[:1])


def _below(a: str, b: str) -> bool:
    """Folder a is inside folder b (trainer.sub inside trainer; every folder inside "")."""
    return a != b and (b == "" or a.startswith(b + "."))


def layer_violations(graph: dict[str, set[str]], modules: dict[str, Path] = ALL_MODULES) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        a = unit_of(module, modules)
        for t in sorted(targets):
            b = unit_of(t, modules)
            da, db = declared_unit(a), declared_unit(b)
            if a == b:
                continue
            if da != db and not LAYER[db] < LAYER[da]:
                out.append(f"{module} ({a}) imports {t} ({b}): a layer imports only from the layers below it")
            elif da == db and _below(a, b):
                out.append(f"{module} ({a}) imports {t} ({b}): a folder never imports the folder it is in")
    return out


def test_every_module_has_a_declared_layer():
    missing = sorted({declared_unit(unit_of(m)) for m in ALL_MODULES} - set(LAYER))
    assert not missing, f"units with no layer in LAYERS: {missing}"


def test_layers_import_only_downwards():
    bad = layer_violations(import_graph())
    assert not bad, "\n".join(bad)


def test_the_layer_check_fails_when_broken():
    """An engine module importing the tui, or the plan importing the run directory, is refused."""
    graph = {"scaletrain.engine.plan.planner": {"scaletrain.engine.run.writers", "scaletrain.engine.estimate.memory"},
             "scaletrain.engine.run.writers": {"scaletrain.tui.views.render"},
             "scaletrain.tui.views.render": {"scaletrain.engine.plan.planner"}}
    bad = layer_violations(graph)
    assert len(bad) == 2
    assert "planner (engine.plan) imports scaletrain.engine.run.writers (engine.run)" in bad[0]
    assert "writers (engine.run) imports scaletrain.tui.views.render (tui.views)" in bad[1]


def test_the_layer_check_sees_inside_the_trainer_and_the_tui():
    """A sub-folder of the trainer climbing back to the trainer's modules, the trainer importing the measuring room,
    a tui view importing the wizard, and a folder inside tui/cli/ importing tui/cli: each refused."""
    graph = {"scaletrain.trainer.objectives.build": {"scaletrain.trainer.model"},
             "scaletrain.trainer.train": {"scaletrain.measure.step"},
             "scaletrain.tui.views.render": {"scaletrain.tui.wizard.app"},
             "scaletrain.tui.cli.extra.thing": {"scaletrain.tui.cli.main"},
             "scaletrain.trainer.model": {"scaletrain.trainer.objectives.build"},     # a folder uses its room: fine
             "scaletrain.measure.step": {"scaletrain.trainer.model"}}                 # down a floor: fine
    bad = layer_violations(graph)
    assert [line.split(" ")[0] for line in bad] == ["scaletrain.trainer.objectives.build",
                                                     "scaletrain.trainer.train", "scaletrain.tui.cli.extra.thing",
                                                     "scaletrain.tui.views.render"]


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules_under(root / PACKAGE)


def test_a_python_m_edge_is_an_edge(tmp_path):
    """An engine module that runs a measuring module by name (`python -m scaletrain.measure.trace`) climbs as an
    import would; running the declared entry point (the probes') does not; a docstring naming a module is no edge."""
    init = {f"{d}/__init__.py": "" for d in ("engine", "engine/catalog", "trainer", "measure")}
    good = _tree(tmp_path / "good", {"__init__.py": "", **init,
                                     "engine/catalog/traced.py": '"""Runs scaletrain.measure.trace."""\n'
                                                                 'ARGV = ["-m", "scaletrain.measure.probe"]\n',
                                     "measure/trace.py": "", "measure/probe.py": "import scaletrain.measure.trace\n"})
    assert layer_violations(import_graph(good), good) == []
    bad = _tree(tmp_path / "bad", {"__init__.py": "", **init,
                                   "engine/catalog/traced.py": 'ARGV = ["-m", "scaletrain.measure.trace"]\n',
                                   "measure/trace.py": "", "measure/probe.py": ""})
    assert layer_violations(import_graph(bad), bad) == [
        "scaletrain.engine.catalog.traced (engine.catalog) imports scaletrain.measure.trace (measure): a layer "
        "imports only from the layers below it"]


def test_the_real_tree_names_its_entry_points():
    """The engine runs the trainer and the probes by module string: the graph sees those strings."""
    _imports, runs = graphs()
    named = set().union(*runs.values())
    assert ENTRY_POINTS <= named
    assert "scaletrain.tui.cli" in runs["bench.bench_plan"]      # bench/'s `python -m scaletrain.tui.cli` too


def test_bench_is_covered_and_on_top():
    """bench/'s scripts are in the graph, above everything; the package importing bench/ is refused."""
    imports, _runs = graphs()
    assert any(t.startswith("scaletrain.") for m, ts in imports.items() if m.startswith("bench.") for t in ts)
    assert any(t.startswith("bench.") for m, ts in imports.items() if m.startswith("bench.") for t in ts)
    bad = layer_violations({"scaletrain.engine.plan.planner": {"bench.accuracy"}})
    assert bad and "imports bench.accuracy (bench)" in bad[0]


def scripts_that_run_without_parsing(bench: Path) -> list[str]:
    """bench/ scripts with a __main__ block that reads no arguments: `--help` runs them, and they rewrite results."""
    out = []
    for path in sorted(bench.glob("*.py")):
        text = path.read_text()
        if '__name__ == "__main__"' in text and "ArgumentParser" not in text and "run_groundtruth(" not in text:
            out.append(path.name)
    return out


def test_every_bench_script_parses_its_arguments(tmp_path):
    """`python bench/X.py --help` says what X does and writes nothing: two scripts took it as a run and rewrote a
    results file and a docs page. (run_groundtruth, bench/groundtruth_cli.py, parses for the ground-truth scripts.)"""
    assert len(list(BENCH.glob("*.py"))) > 10 and scripts_that_run_without_parsing(BENCH) == []
    (tmp_path / "bare.py").write_text('import sys\nif __name__ == "__main__":\n    sys.exit(0)\n')
    assert scripts_that_run_without_parsing(tmp_path) == ["bare.py"]


# ---- private names, NVML, function length ------------------------------------------------------------------------
def private_imports() -> list[str]:
    """`from scaletrain.x import _name` anywhere in the package: another module's private name."""
    out = []
    for module, path in MODULES.items():
        for node in ast.walk(parsed(path)):
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
        for node in ast.walk(parsed(path)):
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
                     for n in ast.walk(parsed(path)) if isinstance(n, ast.Constant) and n.value in files)
    assert not spelled, "\n".join(spelled)
