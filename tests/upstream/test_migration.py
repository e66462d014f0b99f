# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""docs/migration.md, applied to upstream's own recipes and run through the real driver.

The blocks are read FROM the doc (``<!-- migration:config -->``, ``migration:recipe-diff``,
``migration:command``), so the doc and this test cannot drift. For each of upstream's
``examples/configs/grpo_math_8B_megatron_fp8.yaml`` (Megatron, FP8 rollout) and
``grpo_math_1B.yaml`` (DTensor v2, BF16 rollout), of the vendored NeMo-RL this session
drives (v0.7.0, or main with ``--nemo-rl main``):

* the documented config file (``defaults:`` = the recipe) is written next to a copy of
  upstream's ``examples/configs/*.yaml``; it passes the documented offline check
  (``cluster_check``); loaded with NeMo-RL's ``load_config`` it differs from the recipe in
  exactly the documented keys; for the FP8 recipe, the documented in-place diff gives the
  same config;
* the documented ``+`` command (``$NEMO_AIS/launchers/run_grpo_ais.py --config ...``) runs
  from the copy's root through ``main()`` and upstream's REAL ``grpo.setup()`` (the boundaries
  of ``_ray_boundary``, via the ``real_setup`` fixture of ``test_setup_real``);
* the loss ``grpo_train`` receives is ``AISClippedPGLossFn`` in mode ``ais`` with NeMo-RL's
  IS options off, while upstream's ``setup()`` (FP8 guard) saw the flag on; the policy is
  built with the AIS worker of the recipe's backend;
* the documented ``-`` command (upstream's ``examples/run_grpo.py`` on the unchanged recipe)
  reaches ``grpo_train`` with upstream's ``ClippedPGLossFn``: the "before" of the diff;
* what the migrated FP8 recipe inherits (an FP8 trainer, 4 optimizer steps per rollout
  batch) is what the offline check's ``trainer`` lines say, loaded through upstream's
  config loading, and the doc prints those lines as the check does; the doc's two settings
  (``migration:bf16-on-policy``) give a BF16 trainer with one update per rollout batch,
  and change nothing else.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import test_setup_real
from _ray_boundary import MEGATRON_AIS_WORKER
from nemo_rl.algorithms import grpo
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn
from nemo_rl.distributed import ray_actor_environment_registry as registry
from shipped_configs import LAUNCHER, REPO_ROOT, flat, launcher

from nemo_ais.nemo_rl import AISClippedPGLossFn, cluster_check
from nemo_ais.nemo_rl.workers import AIS_WORKER_FQNS
from nemo_ais.preflight import check_config

pytestmark = pytest.mark.nemo_rl

real_setup = test_setup_real.real_setup  # the fixture: upstream's real setup(), boundaries
run = launcher()
DOC = REPO_ROOT / "docs" / "migration.md"
NEMO_RL_DIR = Path(grpo.__file__).resolve().parents[2]
DOC_RECIPE = "grpo_math_8B_megatron_fp8.yaml"  # the recipe the doc's blocks name
DTENSOR_V2_BASE = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2"
RECIPES = {  # upstream recipe -> the AIS worker its backend gets
    DOC_RECIPE: MEGATRON_AIS_WORKER,
    "grpo_math_1B.yaml": AIS_WORKER_FQNS[DTENSOR_V2_BASE],
}


def doc_block(name: str) -> str:
    """The fenced block right after ``<!-- migration:<name> -->`` in docs/migration.md."""
    found = re.findall(rf"<!-- migration:{re.escape(name)} -->\s*\n```\w*\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert len(found) == 1, f"docs/migration.md: expected one migration:{name} block"
    return found[0]


def doc_command(sign: str) -> list[str]:
    """The ``-`` (before) or ``+`` (after) line of the documented command diff, split."""
    (line,) = [ln[1:] for ln in doc_block("command").splitlines() if ln.startswith(sign)]
    return shlex.split(line)


def apply_diff(text: str, diff: str) -> str:
    """Apply a one-hunk unified diff without ``@@`` headers (context, ``-`` and ``+`` lines)."""
    old = [ln[1:] for ln in diff.splitlines() if ln[:1] in (" ", "-")]
    new = [ln[1:] for ln in diff.splitlines() if ln[:1] in (" ", "+")]
    lines = text.splitlines()
    starts = [i for i in range(len(lines)) if lines[i : i + len(old)] == old]
    assert len(starts) == 1, f"the documented diff does not apply once (matches at {starts})"
    i = starts[0]
    return "\n".join([*lines[:i], *new, *lines[i + len(old) :]]) + "\n"


@pytest.fixture
def checkout(real_setup, tmp_path) -> Path:
    """A NeMo-RL checkout's ``examples/configs/*.yaml`` copied under the test's cwd (tmp_path).

    Also the container's prebuilt venv of upstream's DTensor v2 worker (``_ray_boundary``
    makes the Megatron one): our AIS worker is registered with its base worker's python.
    """
    configs = tmp_path / "examples" / "configs"
    configs.mkdir(parents=True)
    for path in (NEMO_RL_DIR / "examples" / "configs").glob("*.yaml"):
        shutil.copy2(path, configs / path.name)
    venv_python = tmp_path / "venvs" / DTENSOR_V2_BASE / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.touch()
    return tmp_path


def write_migrated(configs: Path, recipe: str) -> Path:
    """The doc's config block with ``defaults:`` = ``recipe``, saved as ``<recipe>_ais.yaml``."""
    block = doc_block("config")
    assert re.search(rf"^defaults: {re.escape(DOC_RECIPE)}$", block, re.M), block
    text = re.sub(r"^defaults: .*$", f"defaults: {recipe}", block, count=1, flags=re.M)
    path = configs / f"{Path(recipe).stem}_ais.yaml"
    path.write_text(text)
    return path


def test_the_doc_names_the_files_it_changes():
    before, after = doc_command("-"), doc_command("+")
    assert before[:3] == after[:3] == ["uv", "run", "python"]
    assert before[3:5] == ["examples/run_grpo.py", "--config"]
    assert (NEMO_RL_DIR / before[3]).is_file()
    assert before[5] == f"examples/configs/{DOC_RECIPE}" and (NEMO_RL_DIR / before[5]).is_file()
    assert after[3] == "$NEMO_AIS/launchers/run_grpo_ais.py" and after[4] == "--config"
    assert REPO_ROOT / after[3].removeprefix("$NEMO_AIS/") == LAUNCHER
    # the + command's config is the file the config block says it is
    header = doc_block("config").splitlines()[0]
    assert header.startswith(f"# {Path(after[5]).name}:"), header
    assert after[5] == f"examples/configs/{Path(DOC_RECIPE).stem}_ais.yaml"


# launchers/run_grpo_ais.py's public names that are not hooks of a custom entry point: its
# own CLI and loader, and what make_policy_factory calls itself
NOT_HOOKS = {"ConfigError", "main", "parse_args", "load_config_dict", "ais_worker_fqn", "register_ais_workers"}


def test_the_hook_table_lists_every_helper_the_launcher_adds():
    """Section 3's table names each public helper of the launcher as ``ais.<name>(``."""
    section = DOC.read_text().split("## 3.", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"\bais\.(\w+)\(", section))
    hooks = set(run.__all__) - NOT_HOOKS
    assert documented <= set(run.__all__), sorted(documented - set(run.__all__))
    assert hooks <= documented, (
        f"launchers/run_grpo_ais.py exports {sorted(hooks - documented)}: add each to "
        "docs/migration.md section 3 (a hook of a custom entry point) or to NOT_HOOKS"
    )


def test_the_hook_table_lists_every_check_main_runs_before_ray():
    """Every ``*_problems`` check ``main()`` runs is in section 3's table, which says to add them all."""
    section = DOC.read_text().split("## 3.", 1)[1].split("\n## ", 1)[0]
    called = set(re.findall(r"\b(\w+_problems)\(raw", inspect.getsource(run.main)))
    assert {"bypass_problems", "rollout_format_problems"} <= called  # the parse still finds the calls
    assert {name for name in called if f"{name}(raw" not in section} == set()


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_documented_config_changes_only_the_documented_keys(checkout, recipe):
    configs = checkout / "examples" / "configs"
    path = write_migrated(configs, recipe)
    assert cluster_check.main([str(path), "--quiet"]) == 0  # the doc's offline check passes
    migrated = run.load_config_dict(str(path), [])
    upstream = run.load_config_dict(str(configs / recipe), [])
    before, after = flat(upstream), flat(migrated)
    changed = {k for k in before.keys() & after.keys() if before[k] != after[k]}
    assert set(after) - set(before) == {"loss_fn.ais.mode"}
    assert set(before) - set(after) == set()
    assert changed <= {"loss_fn.use_importance_sampling_correction"}
    assert after["loss_fn.use_importance_sampling_correction"] is False
    assert after["loss_fn.ais.mode"] == "ais"
    if recipe == DOC_RECIPE:  # the same change, made in the recipe itself
        edited = configs / recipe
        edited.write_text(apply_diff(edited.read_text(), doc_block("recipe-diff")))
        assert run.load_config_dict(str(edited), []) == migrated


def _trainer_lines(raw) -> list[str]:
    return [str(r) for r in check_config(raw) if r.name == "trainer"]


def test_the_check_says_what_the_migrated_recipe_inherits_and_the_doc_fixes_it(checkout):
    configs = checkout / "examples" / "configs"
    path = write_migrated(configs, DOC_RECIPE)
    raw = run.load_config_dict(str(path), [])  # NeMo-RL's load_config: defaults resolved
    assert raw["policy"]["megatron_cfg"]["fp8_cfg"]["enabled"] is True  # upstream's recipe
    lines = _trainer_lines(raw)
    assert lines[0] == (
        "[OK  ] trainer: FP8 (policy.megatron_cfg.fp8_cfg.enabled=true: e4m3, blockwise "
        "recipe) trainer, 4 optimizer step(s) per rollout batch (4 steps, off-policy after "
        "the first)"
    )
    assert [line[:6] for line in lines] == ["[OK  ]", "[WARN]", "[WARN]"]
    assert "measure the FP8 rollout against an FP8 trainer" in lines[1]
    assert lines[1].endswith("For a BF16 trainer: policy.megatron_cfg.fp8_cfg.enabled=false (docs/migration.md)")
    assert "64 x 32 = 2048 rollouts / policy.train_global_batch_size=512" in lines[2]
    assert lines[2].endswith("policy.train_global_batch_size=2048 (docs/migration.md)")
    assert doc_block("trainer-check").splitlines() == [f"  {line}" for line in lines]

    path.write_text(path.read_text() + doc_block("bf16-on-policy"))  # the doc's two settings
    fixed = run.load_config_dict(str(path), [])
    before, after = flat(raw), flat(fixed)
    assert {k for k in before if before[k] != after.get(k)} == {
        "policy.train_global_batch_size",
        "policy.megatron_cfg.fp8_cfg.enabled",
    }
    assert after["policy.train_global_batch_size"] == 2048
    assert after["policy.megatron_cfg.fp8_cfg.enabled"] is False
    assert _trainer_lines(fixed) == [
        "[OK  ] trainer: bfloat16 (policy.precision) trainer, 1 optimizer step(s) per rollout "
        "batch (on-policy): the setting the diagnostics assume"
    ]
    assert cluster_check.main([str(path), "--quiet"]) == 0
    prose = " ".join(DOC.read_text().split())
    assert (
        "`trainer: bfloat16 (policy.precision) trainer, 1 optimizer step(s) per rollout "
        "batch (on-policy): the setting the diagnostics assume`" in prose
    )


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_documented_command_trains_with_the_ais_loss(real_setup, checkout, recipe):
    rec = real_setup
    configs = checkout / "examples" / "configs"
    write_migrated(configs, recipe)
    argv = doc_command("+")[4:]  # after "uv run python $NEMO_AIS/launchers/run_grpo_ais.py"
    argv[1] = f"examples/configs/{Path(recipe).stem}_ais.yaml"  # the doc's, for DOC_RECIPE
    raw = run.load_config_dict(argv[1], [])  # relative: the cwd is the copy's root
    rec.use_config(raw)
    run.main(argv)

    assert [n for n in rec.driver.names() if n.endswith("grpo_train")] == ["grpo_train"]
    (setup_call,) = rec.setup_calls
    config = setup_call["args"][0]
    built_by_setup = setup_call["returned"][6]
    trained = rec.driver.event("grpo_train")["args"][5]
    # what trains: our loss, AIS on, every NeMo-RL importance-sampling option off
    assert type(built_by_setup) is ClippedPGLossFn and type(trained) is AISClippedPGLossFn
    assert trained.ais.mode == "ais" and trained.enabled
    assert trained.use_importance_sampling_correction is False
    assert trained.truncated_importance_sampling_type is None
    assert trained.sequence_level_importance_ratios is False
    # what upstream's setup() and its FP8 guard saw: the flag on (the launcher's view)
    assert config.loss_fn.use_importance_sampling_correction is True
    assert raw["loss_fn"]["use_importance_sampling_correction"] is False
    precision = raw["policy"]["generation"]["vllm_cfg"]["precision"]
    assert (precision == "fp8") is (recipe == DOC_RECIPE)  # the FP8 guard ran on the 8B one
    assert config.policy["generation"]["vllm_cfg"]["precision"] == precision
    # the policy workers: the AIS worker of the recipe's backend, in its base's prebuilt venv
    (group,) = rec.actors.groups
    assert group["builder"].ray_actor_class_fqn == RECIPES[recipe]
    assert registry.get_actor_python_env(RECIPES[recipe]).endswith("/bin/python")
    (factory_call,) = rec.factory_calls
    assert factory_call["returned"] is setup_call["returned"][0]


def test_the_documented_before_is_upstreams_own_entry_point(real_setup, checkout, monkeypatch):
    """The ``-`` command: upstream's ``examples/run_grpo.py`` on the unchanged FP8 recipe
    trains with ``ClippedPGLossFn`` and NeMo-RL's own IS correction on."""
    rec = real_setup
    before = doc_command("-")
    spec = importlib.util.spec_from_file_location("_nemo_rl_run_grpo", NEMO_RL_DIR / before[3])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rec.driver.install(monkeypatch, module)  # it imported the boundary names at module level
    rec.use_config(run.load_config_dict(before[5], []))
    monkeypatch.setattr(sys, "argv", before[3:])
    module.main()
    trained = rec.driver.event("grpo_train")["args"][5]
    assert type(trained) is ClippedPGLossFn
    assert trained.use_importance_sampling_correction is True
    (group,) = rec.actors.groups
    assert group["builder"].ray_actor_class_fqn.endswith(".MegatronPolicyWorker")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
