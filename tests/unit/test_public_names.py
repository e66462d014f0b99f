# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Every ``nemo_ais`` name the docs promise resolves, exactly as written.

The docs are parsed here, so a new reference is covered without editing this test.

What is checked, in README.md, CONTRIBUTING.md and docs/*.md, inside code only (fenced
blocks and inline backtick spans; prose is not parsed):

* ``from nemo_ais... import a, b as c`` (also the parenthesised, multi-line form, with
  comments): each imported name must exist, imported exactly that way.
* dotted names ``nemo_ais.x.y.Z``: the longest importable module prefix is imported and
  the rest is looked up as attributes. A call written after the name
  (``nemo_ais.m.f(model, ...)``) checks ``nemo_ais.m.f``; a brace list
  (``nemo_ais.workers.{a,b}``) checks each of ``nemo_ais.workers.a`` and ``...b``;
  a module run with ``python -m nemo_ais.x.y`` is a dotted name like any other. Names in
  code comments count (``family: multiplier  # nemo_ais.fp8.Fp8SyncConfig fields``).
* A module that exists but cannot be imported on this CPU machine because a third-party
  package is absent (the NeMo-RL DTensor-v2 and Megatron workers need nemo_automodel and
  Megatron-Bridge) is checked from its source instead: the file must exist and the
  attribute after it (if any) must be a top-level name defined in it.

What is not a name and is skipped: file paths (``nemo_ais/core/loss.py``: slashes, so
never matched) and names followed by ``-`` or ``/`` (a path or a file such as
``nemo_ais.egg-info``), and ``nemo-ais`` CLI commands (a hyphen, never matched).
"""

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])

_FENCED = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
_COMMENT = re.compile(r"#[^\n]*")
_FROM_IMPORT = re.compile(r"\bfrom\s+(nemo_ais(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n;]+)")
_NAME_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_DOTTED = re.compile(r"(?<![\w./-])nemo_ais((?:\.(?:\w+|\{[\w,\s]+\}))+)(?![\w/-])")


def _code_segments(text: str) -> list[str]:
    """Fenced code blocks, then the inline spans of the text around them."""
    blocks = [m.group(2) for m in _FENCED.finditer(text)]
    prose = _FENCED.sub("", text)
    return blocks + [m.group(1) for m in _INLINE.finditer(prose)]


def _expand(suffix: str) -> list[str]:
    """``.a.{b,c}.d`` -> ``["nemo_ais.a.b.d", "nemo_ais.a.c.d"]``."""
    names = ["nemo_ais"]
    for part in re.findall(r"\.(\w+|\{[^}]*\})", suffix):
        options = [o.strip() for o in part.strip("{}").split(",")] if "{" in part else [part]
        names = [f"{n}.{o}" for n in names for o in options]
    return names


def _references() -> dict[str, set[str]]:
    """``{reference: {doc files}}``; a reference is a dotted name or ``from M import x``."""
    refs: dict[str, set[str]] = {}
    for doc in DOCS:
        for code in _code_segments(doc.read_text()):
            for m in _FROM_IMPORT.finditer(_COMMENT.sub("", code)):
                stmt = ast.parse(f"from {m.group(1)} import {m.group(2).rstrip(' `.,')}")
                for alias in stmt.body[0].names:
                    refs.setdefault(f"from {m.group(1)} import {alias.name}", set()).add(doc.name)
            for m in _DOTTED.finditer(code):
                for name in _expand(m.group(1)):
                    refs.setdefault(name, set()).add(doc.name)
    return refs


def _top_level_names(source: str) -> set[str]:
    """Names a module defines at top level (defs, classes, assignments, imports)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, _NAME_NODES):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolve_from_source(module_name: str, attrs: list[str], err: ImportError) -> str | None:
    """A module that needs an absent third-party package: its file and top-level names.

    None when ``module_name`` is not a module (e.g. ``module.Class``, whose parent module
    is the one that failed to import): the caller tries the shorter prefix.
    """
    try:
        spec = importlib.util.find_spec(module_name)
    except ImportError:  # finding it imports its parent, the module that needs the package
        return None
    if spec is None or spec.origin is None:
        raise err
    missing = [a for a in attrs[:1] if a not in _top_level_names(Path(spec.origin).read_text())]
    if missing:
        raise AttributeError(f"{module_name} ({spec.origin}) defines no {missing[0]!r}")
    return spec.origin


def _resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted``, then getattr the rest."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and module_name.startswith(err.name):
                continue  # no such module (or package) here: try a shorter prefix
            if err.name is None or err.name.split(".")[0] in ("nemo_ais", "nemo_rl"):
                raise  # our own (or NeMo-RL's, always importable here) module is missing
            origin = _resolve_from_source(module_name, parts[i:], err)
            if origin is None:
                continue
            return origin
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


REFERENCES = _references()


def test_the_docs_reference_names_at_all():
    # guards the parser: these are written in the docs today (architecture.md, method.md,
    # low_precision.md); if a regex breaks, this list goes empty instead of silently passing
    for ref in (
        "from nemo_ais.core import clipped_pg_loss",
        "from nemo_ais.core import CorrectionConfig",
        "from nemo_ais.config import CorrectionConfig",
        "from nemo_ais.fp8 import quantize_blockwise",
        "nemo_ais.rollout.twin.RolloutTwin",
        "nemo_ais.nemo_rl.workers.dtensor_v2",
    ):
        assert ref in REFERENCES, sorted(REFERENCES)
    assert len(REFERENCES) >= 40


@pytest.mark.parametrize("ref", sorted(REFERENCES))
def test_documented_name_resolves(ref):
    where = ", ".join(sorted(REFERENCES[ref]))
    if ref.startswith("from "):
        module_name, name = ref[len("from ") :].split(" import ")
        module = importlib.import_module(module_name)
        assert hasattr(module, name), f"{where}: `{ref}` fails: {module_name} has no {name!r}"
    else:
        try:
            _resolve(ref)
        except (ImportError, AttributeError) as err:
            pytest.fail(f"{where}: `{ref}` does not resolve ({type(err).__name__}: {err})")


def test_resolver_rejects_a_missing_name():
    # the check above must be able to fail: a misspelt attribute and a missing module
    with pytest.raises(AttributeError):
        _resolve("nemo_ais.core.clipped_pg_losss")
    with pytest.raises(AttributeError, match="no_such_module"):
        _resolve("nemo_ais.no_such_module.Thing")
    with pytest.raises(AttributeError, match="defines no 'NoSuchWorker'"):
        _resolve_from_source("nemo_ais.nemo_rl.workers.megatron", ["NoSuchWorker"], ImportError("megatron.bridge"))


def test_correction_config_is_exported_from_core():
    import nemo_ais.config
    import nemo_ais.core

    assert nemo_ais.core.CorrectionConfig is nemo_ais.config.CorrectionConfig
    assert "CorrectionConfig" in nemo_ais.core.__all__


def test_the_offline_check_has_one_public_name():
    """Issue 28: the README and the migration guide said ``nemo_ais.nemo_rl.cluster_check``,
    docs/cluster.md and the launchers ``nemo_ais.preflight``. The one public name is
    ``nemo_ais.preflight``; the former one appears only where it is documented as an alias.
    """
    files = [*DOCS, *sorted(ROOT.glob("configs/**/*.yaml")), *sorted(ROOT.glob("launchers/*"))]
    stray = []
    for path in files:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            window = " ".join(lines[max(0, i - 2) : i + 3])
            if "cluster_check" in line and "alias" not in window:
                stray.append(f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()}")
    assert not stray, "the offline check is `nemo_ais.preflight`; found:\n" + "\n".join(stray)
    for doc in ("README.md", "docs/migration.md", "docs/cluster.md"):
        assert "python -m nemo_ais.preflight " in (ROOT / doc).read_text(), doc
