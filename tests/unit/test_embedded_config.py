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
    raw = load_config(DEFAULT, ["grpo.max_num_steps=7", "experiment.arms.fp8-ais.loss_fn.ais.ema=0.5"])
    assert resolve_arm(raw, "bf16").grpo.max_num_steps == 7
    assert resolve_arm(raw, "fp8-ais").correction.ema == 0.5
    assert resolve_arm(raw, "fp8-tis").correction.ema == 0.0


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("grpo.foo=1", r"grpo\.foo is not a known field"),
        ("foo.bar=1", r"foo is not a known section"),
        ("rollout.fp8.bogus=1", r"rollout\.fp8\.bogus is not a known field"),
        ("rollout.format=fp4", r"rollout\.format='fp4' is invalid: expected 'bf16', 'fp8', "),
        ("rollout.kv_cache=int8", r"rollout\.kv_cache='int8' is invalid: .*'nvfp4'"),
        ("rollout.quantizer.bogus=1", r"rollout\.quantizer\.bogus is not a known field"),
        ("rollout.quantizer.format=fp8", r"rollout\.quantizer\.format .* set at rollout\.format"),
        ("rollout.quantizer.block=[0,128]", r"rollout\.quantizer\.block=\[0, 128\] is invalid: expected two positive"),
        (
            "rollout.quantizer.weight_block=[128,128]",
            r"rollout\.quantizer\.weight_block was renamed block .*write block=\[128, 128\]",
        ),
        ("rollout.fp8.weight_eps=0.1", r"^rollout\.fp8\.weight_eps was renamed eps "),
        ("rollout.keep_patterns=['(']", r"rollout\.keep_patterns"),
        ("rollout.num_first_layers_in_bf16=-1", r"rollout\.num_first_layers_in_bf16=-1"),
        ("rollout.fp8.enabled=2", r"rollout\.fp8\.enabled=2 is invalid: expected true or"),
        ("loss_fn.ais.weight_cap=0.5", r"loss_fn\.ais\.weight_cap=0\.5 is invalid"),
        ("loss_fn.ratio_clip_min=2", r"loss_fn\.ratio_clip_min=2 is invalid"),
        ("policy.model.num_attention_heads=3", r"policy\.model\..*divisible"),
        ("experiment.arms.bf16.loss_fn.ais.mode=bad", r"experiment\.arms\.bf16: loss_fn\.ais\.mode"),
        ("experiment.include=[nope]", r"experiment\..*unknown arms"),
        ("cluster.dp_size=4", r"cluster\.dp_size=4 must divide"),
        ("policy.train_global_batch_size=24", r"policy\.train_global_batch_size=24 must divide"),
        ("grpo.num_generations_per_prompt=1", r"grpo\.num_generations_per_prompt=1 is invalid"),
        ("data.reward=fuzzy", r"data\.reward='fuzzy' is invalid"),
        ("data.task=addition", r"data\.sft_alt_fraction=0\.7 applies to task=chain only"),
        ("data.chain_length=0", r"data\.chain_length=0 is invalid"),
        ("data.sft_alt_fraction=1.0", r"data\.sft_alt_fraction=1\.0 is invalid"),
        ("experiment.reference_arm=nope", r"experiment\.reference_arm='nope' is not an arm"),
        # one task, one warm start, one launch for every arm: an arm's own would be ignored or mismatched
        ("experiment.arms.bf16.data.num_digits=3", r"experiment\.arms\.bf16\.data\.num_digits is invalid: every arm"),
        ("experiment.arms.bf16.data.eval_seed=3", r"experiment\.arms\.bf16\.data\.eval_seed is invalid: every arm"),
        ("experiment.arms.bf16.data=null", r"experiment\.arms\.bf16\.data is invalid: every arm"),  # all defaults
        ("experiment.arms.fp8-ais.policy.model.hidden_size=128", r"experiment\.arms\.fp8-ais\.policy\.model is inv"),
        ("experiment.arms.fp8-tis.policy.warm_start.steps=0", r"experiment\.arms\.fp8-tis\.policy\.warm_start is"),
        ("experiment.arms.bf16.cluster.dp_size=1", r"experiment\.arms\.bf16\.cluster is invalid"),
        ("experiment.arms.bf16.logger.name=elsewhere", r"experiment\.arms\.bf16\.logger is invalid: .* run directory"),
        # no reference policy in the recipe: a KL penalty crashed at the first step, after config.yaml was pinned
        ("loss_fn.reference_policy_kl_penalty=0.01", r"reference_policy_kl_penalty=0\.01 is invalid here: expected 0"),
        # refused when the config is read, not by torch or the task after config.yaml is pinned
        ("data.eval_size=10000", r"data\.eval_size=10000 is invalid: expected 0\.\."),
        ("policy.optimizer.betas=[1.5,0.9]", r"policy\.optimizer\.betas=\[1\.5, 0\.9\] is invalid: expected two"),
        ("policy.model.hidden_size=12", r"hidden_size=12 / num_attention_heads=4 = 3 is invalid: expected an even"),
        ("cluster.timeout_s=1e300", r"cluster\.timeout_s=1e\+300 is invalid"),
    ],
)
@pytest.mark.filterwarnings("ignore:rollout.fp8:FutureWarning")
def test_bad_keys_and_values_name_the_path(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(DEFAULT, [override])


def test_an_arm_may_score_with_its_own_reward():
    raw = load_config(DEFAULT, ["experiment.arms.fp8-ais.data.reward=digits"])
    assert resolve_arm(raw, "fp8-ais").data.reward == "digits" and resolve_arm(raw, None).data.reward != "digits"


def test_a_kv_cache_format_the_head_dim_cannot_block_is_refused_when_read():
    with pytest.raises(
        ValueError, match=r"policy\.model \(hidden_size / num_attention_heads\): kv_cache='nvfp4' needs"
    ):
        load_config(DEFAULT, ["rollout.kv_cache=nvfp4", "policy.model.hidden_size=80"])  # head dim 20


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


@pytest.mark.parametrize("name", ["qwen3_8b_2n8g_fp8.yaml", "smoke_qwen3_0.6b_1n.yaml"])
def test_a_nemo_rl_config_is_named_as_such(name, capsys):
    """A cluster config given to nemo-ais run points to the launchers, not to a resolver."""
    path = CONFIG_DIR.parents[2] / "configs" / "nemo_rl" / name
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path} is a NeMo-RL run config" in err and "launchers/" in err


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
    for name, model in cfg_mod.SECTION_MODELS.items():
        assert set(data[name]) == set(model.model_fields), name
    for (section, sub), model in cfg_mod.NESTED_MODELS.items():
        assert set(data[section][sub]) == set(model.model_fields), f"{section}.{sub}"
    # and the YAML values are the models' defaults, every section without exception, so
    # docs and code cannot drift apart
    base = resolve_arm(load_config(DEFAULT), None)
    for name, model in cfg_mod.SECTION_MODELS.items():
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
        if field.name != "raw":
            assert getattr(got, field.name) == getattr(want, field.name), field.name
    assert got.precision.kv_cache == want.precision.kv_cache == "fp8" or arm == "bf16"


def test_cli_help_states_the_default_experiment(capsys):
    import re

    with pytest.raises(SystemExit):
        main(["--help"])
    claim = re.search(r"default experiment, (\d+) arms x (\d+) seeds", capsys.readouterr().out)
    assert claim, "nemo-ais --help no longer states the default experiment"
    experiment = load_config(DEFAULT)["experiment"]
    assert (int(claim[1]), int(claim[2])) == (len(experiment["arms"]), len(experiment["seeds"]))


def _former_spelling(raw):
    """``raw`` written with the deprecated ``rollout.fp8`` block, as default.yaml was."""
    import copy

    old = copy.deepcopy(raw)
    rollout = old["rollout"]
    quantizer = rollout.pop("quantizer")
    for key in ("format", "kv_cache", "num_first_layers_in_bf16", "num_last_layers_in_bf16"):
        rollout.pop(key)
    rollout.pop("attention_in_bf16"), rollout.pop("keep_patterns")
    rollout["fp8"] = {"enabled": True, **quantizer, "kv_cache_fp8": True}
    old["experiment"]["arms"]["bf16"]["rollout"] = {"fp8": {"enabled": False}}
    return old


def _validated(cfg):
    import dataclasses

    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "raw"}
    out["experiment"] = cfg.experiment.model_dump(exclude={"arms"})  # arms: raw overrides
    return out


def test_the_former_fp8_block_reads_as_the_current_keys():
    from nemo_ais.embedded.config import migrate_config

    new = load_config(DEFAULT)
    old = _former_spelling(new)
    with pytest.warns(FutureWarning, match=r"rollout\.fp8 .* is deprecated"):
        assert migrate_config(old) == new
    for arm in [None, *new["experiment"]["arms"]]:
        with pytest.warns(FutureWarning):
            assert _validated(resolve_arm(old, arm)) == _validated(resolve_arm(new, arm)), arm
    # the former overrides keep their meaning: kv_cache_fp8 only where the format quantizes
    with pytest.warns(FutureWarning):
        raw = load_config(DEFAULT, ["rollout.fp8.kv_cache_fp8=false", "rollout.fp8.ue8m0=true"])
    assert "fp8" not in raw["rollout"]
    fp8, bf16 = resolve_arm(raw, "fp8-ais").precision, resolve_arm(raw, "bf16").precision
    assert (fp8.format, fp8.kv_cache, fp8.ue8m0) == ("fp8", "bf16", True)
    assert (bf16.format, bf16.kv_cache, bf16.enabled) == ("bf16", "bf16", False)
    with pytest.warns(FutureWarning):
        raw = load_config(DEFAULT, ["rollout.fp8.enabled=false"])
    assert all(not resolve_arm(raw, a).precision.enabled for a in raw["experiment"]["arms"])
    with pytest.raises(ValueError, match=r"rollout\.fp8\.enabled .* cannot be combined"):
        load_config(DEFAULT, ["rollout.fp8.enabled=true", "rollout.fp8.format=mxfp8"])


def test_a_run_pinned_with_the_former_block_resumes(tmp_path):
    """An old run directory's config.yaml (rollout.fp8) matches the same config today."""
    import yaml

    from nemo_ais.embedded.dist import RecipeError
    from nemo_ais.embedded.experiment import CONFIG_FILE, prepare_run_dir

    raw = load_config(DEFAULT, [f"logger.run_dir={tmp_path}"])
    run_dir = tmp_path / raw["logger"]["name"]
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")  # the old run's results (a resume, not a re-pin)
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(_former_spelling(raw)))
    assert prepare_run_dir(raw, resolve_arm(raw, None), overwrite=False) == run_dir
    assert "kv_cache: fp8" in (run_dir / CONFIG_FILE).read_text()  # re-pinned, current keys
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(_former_spelling(raw)))
    other = load_config(DEFAULT, [f"logger.run_dir={tmp_path}", "rollout.kv_cache=nvfp4"])
    with pytest.raises(RecipeError, match=r"rollout\.kv_cache: 'fp8' -> 'nvfp4'"):
        prepare_run_dir(other, resolve_arm(other, None), overwrite=False)


@pytest.mark.parametrize("pinned", [None, "", "a: [", "- a list\n"])
def test_results_without_a_readable_pinned_config_are_refused(tmp_path, pinned):
    """An interrupted --overwrite (config removed last now), a deleted, cut or empty config.yaml: no resume."""
    from nemo_ais.embedded.dist import RecipeError
    from nemo_ais.embedded.experiment import CONFIG_FILE, prepare_run_dir

    raw = load_config(DEFAULT, [f"logger.run_dir={tmp_path}"])
    run_dir = tmp_path / raw["logger"]["name"]
    (run_dir / "checkpoints").mkdir(parents=True)  # results of some run
    if pinned is not None:
        (run_dir / CONFIG_FILE).write_text(pinned)
    with pytest.raises(RecipeError, match=r"config\.yaml|pinned") as info:
        prepare_run_dir(raw, resolve_arm(raw, None), overwrite=False)
    assert "--overwrite" in str(info.value)
    assert (run_dir / CONFIG_FILE).read_text() == pinned if pinned is not None else not (run_dir / CONFIG_FILE).exists()
    assert prepare_run_dir(raw, resolve_arm(raw, None), overwrite=True) == run_dir  # the way out
    assert not (run_dir / "checkpoints").exists() and (run_dir / CONFIG_FILE).is_file()


def test_one_launch_at_a_time_claims_a_run_directory(tmp_path, monkeypatch):
    """A second launcher is refused at once; live ranks of a killed one are waited for, then refused."""
    import fcntl

    from nemo_ais.embedded import experiment
    from nemo_ais.embedded.dist import RecipeError

    with experiment.claim_run_dir(tmp_path):
        with pytest.raises(RecipeError, match="another nemo-ais run is writing"):
            with experiment.claim_run_dir(tmp_path):
                pass
    monkeypatch.setattr(experiment, "_RANKS_GONE_S", 0.3)
    with (tmp_path / experiment._RANKS_LOCK).open("a") as rank:
        fcntl.flock(rank, fcntl.LOCK_SH)  # a rank still alive
        with pytest.raises(RecipeError, match="trainer ranks of an earlier launch"):
            with experiment.claim_run_dir(tmp_path):
                pass
    with experiment.claim_run_dir(tmp_path):  # the rank gone: claimed
        pass


def test_a_filesystem_without_locks_runs_unclaimed_with_a_warning(tmp_path, monkeypatch):
    """Lustre noflock, some FUSE mounts: flock fails with ENOLCK / ENOSYS; the run goes on, the claim skipped."""
    import errno
    import fcntl

    from nemo_ais.embedded import experiment

    def no_locks(handle, mode):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.warns(UserWarning, match="has no file locks"):
        with experiment.claim_run_dir(tmp_path):
            pass


def test_a_run_resumes_under_another_spelling_of_its_directory(tmp_path, monkeypatch):
    from nemo_ais.embedded.experiment import prepare_run_dir

    monkeypatch.chdir(tmp_path)
    raw = load_config(DEFAULT, ["logger.run_dir=runs"])
    run_dir = prepare_run_dir(raw, resolve_arm(raw, None), overwrite=False)
    (run_dir / "metrics.jsonl").write_text("")  # a result: the pinned config is compared
    again = load_config(DEFAULT, ["logger.run_dir=./runs/../runs"])  # the same directory
    assert prepare_run_dir(again, resolve_arm(again, None), overwrite=False).resolve() == run_dir.resolve()


def test_overwrite_clears_every_output_of_the_run_and_nothing_outside_it(tmp_path):
    from nemo_ais.embedded.experiment import prepare_run_dir

    raw = load_config(DEFAULT, [f"logger.run_dir={tmp_path}"])
    run_dir = prepare_run_dir(raw, resolve_arm(raw, None), overwrite=False)
    outputs = ["metrics.jsonl", "summary.md", "reward.png", "diagnostics.png", "tolerance.json", "tolerance.png"]
    for name in [*outputs, "checkpoints/x.pt", "logs/bf16_seed0/train_data.jsonl"]:
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text("old run")
    (tmp_path / "beside.png").write_text("not this run's")
    assert prepare_run_dir(raw, resolve_arm(raw, None), overwrite=True) == run_dir
    kept = sorted(p.name for p in run_dir.iterdir())
    assert kept == [".launch.lock", ".ranks.lock", "config.yaml"]  # the new run's pin, and the launch claim
    assert (tmp_path / "beside.png").read_text() == "not this run's"
    for name in (".", ".."):  # run_dir/name itself or its parent would be cleared
        with pytest.raises(ValueError, match=r"logger\.name='\.{1,2}' is invalid: expected a directory name"):
            load_config(DEFAULT, [f"logger.name={name}"])


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4_w4a16", "nvfp4_w4a4"])
def test_rollout_format_and_kv_cache_select_the_twin(fmt):
    raw = load_config(DEFAULT, [f"rollout.format={fmt}", "rollout.kv_cache=nvfp4"])
    for arm in ("fp8-none", "fp8-ais"):
        precision = resolve_arm(raw, arm).precision
        assert (precision.format, precision.kv_cache) == (fmt, "nvfp4")
    assert not resolve_arm(raw, "bf16").precision.enabled  # the BF16 arm stays exact


def test_bypass_needs_one_optimizer_step_per_rollout_batch():
    # pi_old := mu holds only before the first update of a rollout batch
    ok = load_config(DEFAULT, ["experiment.arms.fp8-ais.loss_fn.ais.bypass=true"])
    assert resolve_arm(ok, "fp8-ais").correction.bypass is True
    with pytest.raises(ValueError, match=r"experiment\.arms\.fp8-ais: loss_fn\.ais\.bypass=true needs one optimizer"):
        load_config(DEFAULT, ["experiment.arms.fp8-ais.loss_fn.ais.bypass=true", "policy.train_global_batch_size=32"])
