# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Config loading, validation errors naming the key path, and the CLI surface."""

import pytest

from nemo_ais.cli import main
from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm

DEFAULT = CONFIG_DIR / "default.yaml"


@pytest.mark.parametrize("name", ["default.yaml", "quick.yaml"])
def test_shipped_configs_validate_every_arm(name):
    raw = load_config(CONFIG_DIR / name)
    arms = {a: resolve_arm(raw, a) for a in raw["experiment"]["arms"]}
    assert set(arms) == {"bf16", "fp8-none", "fp8-tis", "fp8-ais"}
    assert arms["bf16"].fp8.enabled is False and arms["bf16"].correction.mode == "none"
    assert arms["fp8-ais"].fp8.enabled and arms["fp8-ais"].correction.mode == "ais"
    assert arms["fp8-tis"].correction.mode == "tis"


def test_overrides_apply_dotted_and_to_arms():
    raw = load_config(
        DEFAULT, ["grpo.max_num_steps=7", "experiment.arms.fp8-ais.loss_fn.ais.ema=0.5"]
    )
    assert resolve_arm(raw, "bf16").grpo.max_num_steps == 7
    assert resolve_arm(raw, "fp8-ais").correction.ema == 0.5
    assert resolve_arm(raw, "fp8-tis").correction.ema == 0.0


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("grpo.foo=1", r"grpo\.foo is not a known field"),
        ("foo.bar=1", r"foo is not a known section"),
        ("rollout.fp8.bogus=1", r"rollout\.fp8\.bogus is not a known field"),
        ("loss_fn.ais.weight_cap=0.5", r"loss_fn\.ais\.weight_cap=0\.5 is invalid"),
        ("loss_fn.ratio_clip_min=2", r"loss_fn\.ratio_clip_min=2 is invalid"),
        ("policy.model.num_attention_heads=3", r"policy\.model\..*divisible"),
        (
            "experiment.arms.bf16.loss_fn.ais.mode=bad",
            r"experiment\.arms\.bf16: loss_fn\.ais\.mode",
        ),
        ("experiment.include=[nope]", r"experiment\..*unknown arms"),
        ("cluster.dp_size=4", r"cluster\.dp_size=4 must divide"),
        ("policy.train_global_batch_size=24", r"policy\.train_global_batch_size=24 must divide"),
        ("grpo.num_generations_per_prompt=1", r"grpo\.num_generations_per_prompt=1 is invalid"),
        ("data.reward=fuzzy", r"data\.reward='fuzzy' is invalid"),
        ("data.task=addition", r"data\.sft_alt_fraction=0\.7 applies to task=chain only"),
        ("data.chain_length=0", r"data\.chain_length=0 is invalid"),
        ("data.sft_alt_fraction=1.0", r"data\.sft_alt_fraction=1\.0 is invalid"),
        ("experiment.reference_arm=nope", r"experiment\.reference_arm='nope' is not an arm"),
    ],
)
def test_bad_keys_and_values_name_the_path(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(DEFAULT, [override])


def test_malformed_yaml_and_override(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: [1, 2\n")
    with pytest.raises(ValueError, match="malformed YAML"):
        load_config(bad)
    with pytest.raises(ValueError, match=r"expected key\.path=value"):
        load_config(DEFAULT, ["grpo.max_num_steps"])
    child = tmp_path / "child.yaml"
    child.write_text(f"defaults: {DEFAULT}\ngrpo:\n  max_num_steps: 3\n")
    assert load_config(child)["grpo"]["max_num_steps"] == 3


def test_cli_reports_config_errors(capsys):
    assert main(["run", "grpo.nope=1"]) == 2
    err = capsys.readouterr().err
    assert "grpo.nope is not a known field" in err


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["report", "--help"]])
def test_cli_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert "usage: nemo-ais" in capsys.readouterr().out


def test_report_on_missing_dir(tmp_path, capsys):
    assert main(["report", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_default_yaml_is_an_exemplar_of_every_section_model():
    import yaml

    from nemo_ais.embedded import config as cfg_mod

    data = yaml.safe_load(DEFAULT.read_text())
    for name, model in cfg_mod._SECTION_MODELS.items():
        assert set(data[name]) == set(model.model_fields), name
    for (section, sub), model in cfg_mod._NESTED_MODELS.items():
        assert set(data[section][sub]) == set(model.model_fields), f"{section}.{sub}"
    # and the YAML values are the models' defaults, every section without exception, so
    # docs and code cannot drift apart
    base = resolve_arm(load_config(DEFAULT), None)
    for name, model in cfg_mod._SECTION_MODELS.items():
        assert getattr(base, name) == model(), name


@pytest.mark.parametrize("arm", [None, "bf16", "fp8-none", "fp8-tis", "fp8-ais"])
def test_an_empty_config_is_default_yaml(arm):
    """One source of truth: leaving every key out gives what default.yaml states.

    Compares the validated objects (every section model, ``loss_fn``, ``loss_fn.ais`` and
    the FP8 rollout config, e.g. its KV-cache format), the base config and every arm.
    """
    import dataclasses

    want = resolve_arm(load_config(DEFAULT), arm)
    got = resolve_arm({}, arm)
    for field in dataclasses.fields(want):
        if field.name == "rollout":  # its fp8 dict is raw input; compared validated, as fp8
            assert got.rollout.model_dump(exclude={"fp8"}) == want.rollout.model_dump(
                exclude={"fp8"}
            )
        elif field.name != "raw":
            assert getattr(got, field.name) == getattr(want, field.name), field.name
    assert got.fp8.kv_cache == want.fp8.kv_cache == "fp8" or arm == "bf16"


def test_cli_help_states_the_default_experiment(capsys):
    import re

    with pytest.raises(SystemExit):
        main(["--help"])
    claim = re.search(r"default experiment, (\d+) arms x (\d+) seeds", capsys.readouterr().out)
    assert claim, "nemo-ais --help no longer states the default experiment"
    experiment = load_config(DEFAULT)["experiment"]
    assert (int(claim[1]), int(claim[2])) == (len(experiment["arms"]), len(experiment["seeds"]))
