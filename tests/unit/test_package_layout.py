# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Layout of ``nemo_ais``: no import circle, no upward import, every module imports alone.

The import graph is read from the source with ``ast``: every ``import`` statement that
runs (module level or inside a function); the circle check also reads those under
``if TYPE_CHECKING:`` (a circle drawn for the type checker is still a circle). A
package may import only the packages :data:`MAY_IMPORT` lists for it (docs/architecture.md,
"What each package may import"); the runtime adapters never import the offline check.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import nemo_ais

ROOT = Path(nemo_ais.__file__).parent
MODULES = {
    ".".join(("nemo_ais", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__"): p
    for p in ROOT.rglob("*.py")
}
_STDLIB_ONLY: set[str] = set()
MAY_IMPORT = {
    "rules": _STDLIB_ONLY,
    "formats": {"config", "rules"},  # rules.format_geometry: the torch-free block table
    "refit": {"config", "formats", "rules", "sections"},  # refit.config: the torch-free section configs
    "rollout": {"config", "formats", "refit", "rules"},
    "tools": {"config", "formats", "plotting", "refit", "rollout", "rules"},
    "kernels": {"formats"},  # GPU (Triton) fast paths of the formats' quantizers
    "fp8": {"formats", "refit"},  # the compatibility face (former submodules resolve lazily)
    "core": {"config", "modes"},  # the method: its config and the correction-mode records
}
"""``{package: the nemo_ais packages and top-level modules it may import}``."""


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (never executed)."""
    for node in ast.iter_child_nodes(tree):
        test = node.test if isinstance(node, ast.If) else None
        if test is not None and "TYPE_CHECKING" in ast.unparse(test):
            yield from (n for child in node.orelse for n in (child, *_runtime_nodes(child)))
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(module: str, typing_too: bool = False) -> set[str]:
    """The ``nemo_ais`` modules that ``module`` imports at run time (or also for typing)."""
    out: set[str] = set()
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree) if typing_too else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # "from nemo_ais.formats import te_backend" imports the submodule, not the face
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [s for s in subs if s in MODULES] or [node.module]
        else:
            continue
        out |= {n for n in names if n in MODULES}
    return out - {module}


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _graph(packages) -> dict[str, set[str]]:
    return {m: _imports(m) for m in MODULES if _package(m) in packages}


PREFLIGHT_FACES = {"nemo_ais.nemo_rl.cluster_check", "nemo_ais.nemo_rl.memory_budget"}
"""The offline tool's former ``python -m`` paths (README, config headers): faces, no code."""


def test_no_import_cycle():
    # typing-only imports count: a circle drawn only for the type checker is still a circle
    graph = {m: _imports(m, typing_too=True) for m in MODULES}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_runtime_adapters_import_nothing_from_the_offline_check():
    found = sorted(
        f"{m} -> {dep}"
        for m, deps in _graph({"nemo_rl", "megatron", "core"}).items()
        if m not in PREFLIGHT_FACES
        for dep in deps
        if _package(dep) == "preflight"
    )
    assert not found, found


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_a_package_imports_only_what_it_may(package: str):
    allowed = MAY_IMPORT[package] | {package, "nemo_ais"}
    upward = sorted(
        f"{m} -> {dep}" for m, deps in _graph({package}).items() for dep in deps if _package(dep) not in allowed
    )
    assert not upward, f"{package} may import {sorted(MAY_IMPORT[package])}; found {upward}"


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_rules_are_torch_free():
    for module in _graph({"rules"}):
        tree = ast.parse(MODULES[module].read_text())
        imported = {
            (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
            for n in _runtime_nodes(tree)
            if isinstance(n, ast.Import | ast.ImportFrom) and getattr(n, "level", 0) == 0
            for a in (n.names if isinstance(n, ast.Import) else [n])
        }
        assert not imported - set(sys.stdlib_module_names) - {"nemo_ais"}, (module, imported)


def test_every_module_of_the_split_packages_imports_on_its_own():
    names = sorted(m for m in MODULES if _package(m) in MAY_IMPORT)
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for key in [k for k in sys.modules if k == 'nemo_ais' or k.startswith('nemo_ais.')]:\n"
        "        del sys.modules[key]\n"
        "    importlib.import_module(name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
