# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The suite's skip policy (tests/skip_policy.py): exact reasons, no xfail, broken TE fails."""

from __future__ import annotations

import types

import pytest
import skip_policy
from skip_policy import ALLOWED_SKIP_REASONS, NO_CUDA, TE_ABSENT, TE_INSTALLED, refusal, require_te

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("reason", sorted(ALLOWED_SKIP_REASONS))
def test_allowed_reasons_stand_with_or_without_pytest_prefix(reason):
    assert refusal(reason, None) is None
    assert refusal(f"Skipped: {reason}", None) is None
    assert refusal(None, None) is None  # not skipped, not xfailed


@pytest.mark.parametrize(
    "reason",
    [
        # each matched the former regex (CUDA|GPU|transformer.engine|vLLM) and was let through
        "no GPU, and NeMo-RL did not import either",
        "vllm test flaked, skip for now",
        "could not import 'transformer_engine.pytorch': libcudart.so.12: cannot open",
        f"{NO_CUDA} (and a race lost)",
        # and the reasons the former policy refused stay refused
        "needs bash",
        "megatron-core not installed (pip install 'nemo-ais[megatron]')",
        "",
    ],
)
def test_any_other_skip_reason_is_refused(reason):
    why = refusal(f"Skipped: {reason}", None)
    assert why is not None and repr(reason) in why


@pytest.mark.parametrize("xfail", ["", "reason: known bug", "GPU nondeterminism", NO_CUDA])
def test_every_xfail_is_refused(xfail):
    why = refusal(None, xfail)
    assert why is not None and "xfail is not allowed" in why


def _fake_importlib(monkeypatch, *, spec, module=None, error=None):
    def import_module(name):
        if error is not None:
            raise error
        return module

    fake = types.SimpleNamespace(util=types.SimpleNamespace(find_spec=lambda name: spec), import_module=import_module)
    monkeypatch.setattr(skip_policy, "importlib", fake)


def test_absent_te_skips_with_the_allowed_reason(monkeypatch):
    _fake_importlib(monkeypatch, spec=None)
    with pytest.raises(pytest.skip.Exception, match=r"Transformer Engine not installed") as exc:
        require_te()
    assert exc.value.msg == TE_ABSENT and refusal(exc.value.msg, None) is None


def test_broken_te_fails_instead_of_skipping(monkeypatch):
    broken = ImportError("libcudart.so.12: cannot open shared object file")
    _fake_importlib(monkeypatch, spec=object(), error=broken)
    with pytest.raises(pytest.fail.Exception, match=r"installed but .* does not import"):
        require_te()


def test_working_te_is_returned(monkeypatch):
    module = types.ModuleType(skip_policy.TE_MODULE)
    _fake_importlib(monkeypatch, spec=object(), module=module)
    assert require_te() is module


def test_hooks_fail_a_run_that_skips_or_xfails_for_another_reason(pytester):
    pytester.makeconftest("from skip_policy import pytest_make_collect_report, pytest_runtest_makereport\n")
    pytester.makepyfile(
        test_cases=f"""
        import pytest

        def test_no_cuda():
            pytest.skip({NO_CUDA!r})

        @pytest.mark.skipif(True, reason={TE_INSTALLED!r})
        def test_te_installed():
            pass

        def test_loose_gpu_reason():
            pytest.skip("GPU busy, try later")

        def test_missing_package():
            pytest.importorskip("no_such_package_nemo_ais")

        @pytest.mark.xfail(reason="known bug")
        def test_xfailed():
            assert False

        @pytest.mark.xfail(reason="known bug")
        def test_xpassed():
            pass

        def test_imperative_xfail():
            pytest.xfail("later")
        """,
        test_module_skip="""
        import pytest

        pytest.skip("whole module skipped", allow_module_level=True)

        def test_never():
            pass
        """,
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--continue-on-collection-errors")
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") == 2, result.stdout.str()
    assert "xfailed" not in outcomes and "xpassed" not in outcomes, outcomes
    assert outcomes.get("failed") == 5 and outcomes.get("errors") == 1, outcomes
    result.stdout.fnmatch_lines(["*does not allow ('GPU busy, try later'*"])
    result.stdout.fnmatch_lines(["*xfail is not allowed in this suite (reason 'known bug'*"])


def test_this_suite_runs_under_the_policy(request):
    hooks = request.config.pluginmanager.hook
    for name in ("pytest_runtest_makereport", "pytest_make_collect_report"):
        impls = getattr(hooks, name).get_hookimpls()
        assert any(h.function is getattr(skip_policy, name) for h in impls), name


def test_no_test_importorskips_transformer_engine():
    # importorskip skips on ANY ImportError, so a broken TE would skip: require_te() instead
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    offenders = [
        f"{path.relative_to(tests)}:{i}"
        for path in sorted(tests.rglob("*.py"))
        if path.name != Path(__file__).name
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if "importorskip(" in line and ("transformer_engine" in line or "TE_MODULE" in line)
    ]
    assert not offenders, offenders


def _cuda_skip_markers():
    """``(file:line, condition, reason)`` of every ``skipif`` whose condition asks for CUDA."""
    import ast
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("skipif")):
                continue
            condition = node.args[0] if node.args else None
            if condition is None or "cuda.is_available" not in ast.unparse(condition):
                continue
            reason = next((k.value for k in node.keywords if k.arg == "reason"), None)
            yield f"{path.relative_to(tests)}:{node.lineno}", condition, reason


def test_cuda_dependent_skips_hold_on_a_cuda_host():
    # Issue 27: a skip whose condition is TRUE on a CUDA host (e.g. "needs a machine
    # without CUDA") is a failure there under this policy, so the suite could never be
    # green on a GPU machine. A CUDA condition may only skip where CUDA is absent, and
    # only with the allowed reason NO_CUDA.
    import ast

    markers = list(_cuda_skip_markers())
    assert markers  # the gpu tests carry such markers: the scan is not vacuous
    for where, condition, reason in markers:
        skips_without_cuda = (
            isinstance(condition, ast.UnaryOp)
            and isinstance(condition.op, ast.Not)
            and ast.unparse(condition.operand).endswith("cuda.is_available()")
        )
        assert skips_without_cuda, f"{where}: skipif({ast.unparse(condition)}) skips on CUDA"
        literal = reason.value if isinstance(reason, ast.Constant) else None
        named = isinstance(reason, ast.Name) and reason.id == "NO_CUDA"
        assert named or literal == NO_CUDA, f"{where}: reason {ast.unparse(reason)}"
