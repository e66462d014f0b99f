# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Layout of the rollout-precision package (``nemo_ais.fp8``): no import cycle.

Two checks: the graph of ``nemo_ais.fp8`` submodules importing each other (every
``import`` statement that runs, module level or inside a function, read with ``ast``;
``if TYPE_CHECKING:`` blocks do not run) has no cycle;
and every submodule imports in an interpreter where no ``nemo_ais`` module was loaded
before it (one subprocess; ``nemo_ais`` is dropped from ``sys.modules`` between modules).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nemo_ais.fp8

PACKAGE = "nemo_ais.fp8"
FP8_DIR = Path(nemo_ais.fp8.__file__).parent
MODULES = sorted(f"{PACKAGE}.{p.stem}" for p in FP8_DIR.glob("*.py") if p.stem != "__init__")


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (never executed)."""
    for node in ast.iter_child_nodes(tree):
        test = node.test if isinstance(node, ast.If) else None
        if test is not None and "TYPE_CHECKING" in ast.unparse(test):
            yield from (n for child in node.orelse for n in (child, *_runtime_nodes(child)))
            continue
        yield node
        yield from _runtime_nodes(node)


def _fp8_imports(module: str) -> set[str]:
    """The ``nemo_ais.fp8`` submodules that ``module``'s source imports at run time (any
    scope, lazy imports in functions included; ``if TYPE_CHECKING:`` blocks excluded)."""
    tree = ast.parse((FP8_DIR / f"{module.rsplit('.', 1)[1]}.py").read_text())
    out: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # "from nemo_ais.fp8 import te_backend" names a submodule too
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        out |= {n for n in names if n in MODULES}
    return out - {module}


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


def test_the_package_has_the_expected_modules():
    for name in ("twin", "twin_modules", "twin_refit", "twin_calibration", "nvfp4", "mxfp8"):
        assert f"{PACKAGE}.{name}" in MODULES, MODULES


def test_no_import_cycle_between_fp8_modules():
    graph = {m: _fp8_imports(m) for m in MODULES}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    # the circle the layout issue named is gone: te_backend does not import quant
    assert f"{PACKAGE}.quant" not in graph[f"{PACKAGE}.te_backend"]


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    # quant_linear names formats for type checking only; formats imports it at run time
    assert f"{PACKAGE}.formats" not in _fp8_imports(f"{PACKAGE}.quant_linear")
    assert f"{PACKAGE}.fp8_linear" in _fp8_imports(f"{PACKAGE}.formats")


def test_every_fp8_module_imports_on_its_own():
    script = (
        "import importlib, sys\n"
        f"for name in {MODULES!r}:\n"
        "    for key in [k for k in sys.modules if k == 'nemo_ais' or k.startswith('nemo_ais.')]:\n"
        "        del sys.modules[key]\n"
        "    importlib.import_module(name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
