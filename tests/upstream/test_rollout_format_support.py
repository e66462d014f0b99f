# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The offline check's NeMo-RL facts for NVFP4 / MXFP8 rollouts, read against both sources.

``nemo_ais.preflight`` never imports NeMo-RL: it has a table of which version runs which
rollout format (:data:`~nemo_ais.preflight.ROLLOUT_FORMATS`, each with a source probe) and
of the NVFP4 mode of NeMo-RL's ModelOpt recipes (``NVFP4_QUANT_CFG_MODES``). Here both
vendored trees (v0.7.0 and main, whatever ``--nemo-rl`` selects) check those tables:

* each probe finds its text in exactly the versions the table names, and
  ``NEMO_RL_DIR=<tree>`` gives the same target as ``--nemo-rl-version``;
* each recipe's mode is the one main's own resolver derives from its quantizer entries
  (``_resolve_effective_quantizer_formats`` + ``_validate_nvfp4_quantizer_format``, the
  body of ``resolve_nvfp4_real_quant_mode`` after ModelOpt's schema normalisation, which
  needs ModelOpt and a GPU build; the recipes' entries are already in that list form).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from nemo_ais.preflight import NEMO_RL_VERSIONS, ROLLOUT_FORMATS, resolve_target
from nemo_ais.preflight.checks.formats import NVFP4_QUANT_CFG_MODES
from nemo_ais.preflight.nemo_rl_target import NESTED_BF16_LAYERS

pytestmark = pytest.mark.nemo_rl

VENDOR = Path(__file__).resolve().parents[3] / "shared" / "vendor"
TREES = {"v0.7.0": VENDOR / "nemo-rl-v0.7.0", "main": VENDOR / "nemo-rl-main-7ea279a"}


def test_the_trees_are_the_supported_versions():
    assert tuple(TREES) == NEMO_RL_VERSIONS
    for tree in TREES.values():
        assert (tree / "nemo_rl" / "algorithms" / "grpo.py").is_file(), tree


@pytest.mark.parametrize("fmt", sorted(ROLLOUT_FORMATS))
def test_each_probe_finds_its_text_in_exactly_the_versions_the_table_names(fmt):
    support = ROLLOUT_FORMATS[fmt]
    found = tuple(
        version
        for version, tree in TREES.items()
        if (tree / support.probe_file).is_file() and support.probe_text in (tree / support.probe_file).read_text()
    )
    assert found == support.versions, (fmt, found)


def test_the_nested_bf16_layers_probe_finds_v070_only():
    # tests/adapters/test_preflight_bf16_layers.py runs both init_fp8s: v0.7.0 nests the list
    probe = NESTED_BF16_LAYERS
    found = tuple(v for v, t in TREES.items() if probe.probe_text in (t / probe.probe_file).read_text())
    assert found == probe.versions == ("v0.7.0",)


@pytest.mark.parametrize("version", NEMO_RL_VERSIONS)
def test_nemo_rl_dir_gives_the_target_of_the_version_name(version):
    by_source, how = resolve_target(None, {"NEMO_RL_DIR": str(TREES[version])})
    by_name, _ = resolve_target(version)
    assert by_source is not None and by_source.formats == by_name.formats, how
    assert by_source.nests_bf16_layers == by_name.nests_bf16_layers == (version == "v0.7.0")
    assert how == f"checked against the NeMo-RL at NEMO_RL_DIR={TREES[version]} (its source)"


def _mains_modelopt_utils() -> ModuleType:
    """main's ``nemo_rl/modelopt/utils.py`` (stdlib imports only), loaded under its own name."""
    path = TREES["main"] / "nemo_rl" / "modelopt" / "utils.py"
    spec = importlib.util.spec_from_file_location("_nemo_rl_main_modelopt_utils", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses / typing resolve through it
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def _mode_by_mains_resolver(utils: ModuleType, recipe: Path) -> str:
    doc = yaml.safe_load(recipe.read_text())
    entries = [{"enable": True, **e} for e in doc.get("quantize", doc)["quant_cfg"]]
    weights, inputs = utils._resolve_effective_quantizer_formats(entries, source=str(recipe))
    assert weights, recipe
    for fmt in weights:
        utils._validate_nvfp4_quantizer_format(fmt, quantizer_name="weights", source="")
    for fmt in inputs:
        utils._validate_nvfp4_quantizer_format(fmt, quantizer_name="inputs", source="")
    return "w4a4" if inputs else "w4a16"


@pytest.mark.parametrize("recipe", sorted(NVFP4_QUANT_CFG_MODES))
def test_each_recipes_mode_is_mains_resolvers(recipe):
    utils = _mains_modelopt_utils()
    assert _mode_by_mains_resolver(utils, TREES["main"] / recipe) == NVFP4_QUANT_CFG_MODES[recipe]


def test_the_table_names_every_nvfp4_recipe_main_ships():
    recipes = TREES["main"] / "examples" / "modelopt" / "quant_configs"
    nvfp4 = {
        f"examples/modelopt/quant_configs/{p.name}"
        for p in recipes.glob("*nvfp4*.yaml")
        if "kv_cache" not in p.name and "w4a8" not in p.name  # KV only; FP8 inputs (refused)
    }
    assert nvfp4 == set(NVFP4_QUANT_CFG_MODES)
    # main refuses W4A8 (FP8 inputs) for real-quant: our table leaves it unknown, so warns
    utils = _mains_modelopt_utils()
    with pytest.raises(ValueError, match="supports only block-16 NVFP4"):
        _mode_by_mains_resolver(utils, recipes / "nvfp4_w4a8_fp8.yaml")
