"""The package's shape: no import cycle, no module over MAX_LINES, the headless part free of Textual and Rich
(and of torch: the engine plans without it, the trainer imports it inside functions).

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
# Modules that must load without Textual or Rich (the engine, the trainer, the CLI's argument parsing).
HEADLESS = ("scaletrain.engine", "scaletrain.trainer", "scaletrain.presets", "scaletrain.tui.cli.plan_args")


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
            "import scaletrain.engine as e\n"
            "[getattr(e, n) for n in e.__all__]\n"
            "print(sorted(m for m in ('textual', 'rich', 'torch', 'transformers') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    assert len(names) > 60
