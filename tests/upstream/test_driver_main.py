# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""launchers/run_grpo_ais.py main() through NeMo-RL's REAL driver code, every config.

For every full config under ``configs/nemo_rl/`` (recursive, arm mixins excluded) the
launcher runs with upstream's real ``load_config`` / ``parse_hydra_overrides`` /
``register_omegaconf_resolvers``, real ``MasterConfig``, real ``get_next_experiment_dir``
and real ``configure_generation_config``. Stubbed, at the narrowest boundary, only what
needs a cluster, a download or a GPU; each stub records what crossed it:

* ``init_ray`` (starts Ray): records the worker environment at that moment;
* ``get_tokenizer`` (HF download): records its config, returns :class:`Tokenizer`;
* ``setup_response_data`` (dataset download): records its arguments;
* inside upstream's REAL ``grpo.setup`` (a spy records its arguments and what it returns):
  Ray actor creation, the vLLM engines, the GPU monitor and the HF config download
  (``_ray_boundary.ActorBoundary``; local Ray for upstream's ``ray.get``);
* ``grpo.grpo_train`` / ``grpo.async_grpo_train`` (the GPU loops): record their arguments;
* ``grpo.shutdown_environments`` (NeMo-RL main: stops the environments' Ray actors after
  training, as main's ``run_grpo.py``): records its arguments.

Each stub replaces the name in the module where ``main()`` looks it up (``main()``
imports them at call time; the stand-ins live in ``_ray_boundary.py``). The datasets are
tiny in-memory ones sized from the config ``main()`` loads. ``test_setup_real.py`` checks
what upstream's ``setup()`` builds; this file checks what ``main()`` hands it and trains.
"""

from __future__ import annotations

import copy
import os
import runpy
import subprocess
import sys
from pathlib import Path

import _ray_boundary
import pytest
from _ray_boundary import ActorBoundary, DriverBoundary, Tokenizer, tiny_datasets
from nemo_rl.algorithms import grpo
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn
from nemo_rl.models.generation import configure_generation_config
from nemo_rl_version import NEMO_RL, per_version
from shipped_configs import CONFIG_DIR, FULL_CONFIGS, LAUNCHER, configs_for, launcher, write_input_amax_files

from nemo_ais.nemo_rl import AISClippedPGLossFn

pytestmark = pytest.mark.nemo_rl

REPO_ROOT = Path(__file__).resolve().parents[2]

run = launcher()


# what main() does after training, per NeMo-RL version (main's run_grpo.py does the same)
AFTER_TRAINING = per_version(v0_7_0=[], main=["shutdown_environments"])


@pytest.fixture
def driver(monkeypatch, tmp_path, local_ray):
    """The driver boundary, tiny datasets of the config main() loads, a spy on real setup()."""
    d = DriverBoundary()
    d.install(monkeypatch)
    d.actors = ActorBoundary(stop=False).install(monkeypatch, tmp_path)
    real_load, real_setup = run.load_config_dict, grpo.setup

    def load_config_dict(path, overrides):  # spy: the datasets follow the config
        raw = real_load(path, overrides)
        train, val = tiny_datasets(raw)
        d.datasets = (train, val, {"math": None}, {"math": None})
        return raw

    def setup(master_config, tokenizer, dataset, val_dataset, **kwargs):  # spy on the real one
        call = {
            "config": master_config,
            "tokenizer": tokenizer,
            "dataset": dataset,
            "val_dataset": val_dataset,
            **kwargs,
            # setup() edits policy.generation in place: keep what main() handed it
            "generation": copy.deepcopy(master_config.policy["generation"]),
        }
        d.events.append(("setup", call))
        call["returned"] = real_setup(master_config, tokenizer, dataset, val_dataset, **kwargs)
        return call["returned"]

    monkeypatch.setattr(run, "load_config_dict", load_config_dict)
    monkeypatch.setattr(grpo, "setup", setup)
    # main() edits the worker environment; restore it after each test.
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("NEMO_AIS_REFIT", "")  # recorded: removed at teardown
    monkeypatch.delenv("NEMO_AIS_REFIT")
    monkeypatch.chdir(tmp_path)  # logger.log_dir / checkpoint_dir are relative
    write_input_amax_files(tmp_path)  # W4A4: the launcher reads its calibration before Ray
    return d


def _rel(path: Path) -> str:
    return str(path.relative_to(CONFIG_DIR))


def test_every_shipped_full_config_is_driven():
    # v0.7.0 refuses the two main-only rollout formats (test_setup_real.py)
    assert len(FULL_CONFIGS) == 17, [_rel(p) for p in FULL_CONFIGS]
    assert len(configs_for(NEMO_RL)) == per_version(v0_7_0=15, main=17)


@pytest.mark.parametrize("path", configs_for(NEMO_RL), ids=_rel)
def test_main_reaches_setup_and_trains_with_upstreams_driver_code(driver, path):
    raw = run.load_config_dict(str(path), [])
    ais_cfg = run.validate_ais(raw)
    _ray_boundary.ENGINE_GPU["gpu"] = _ray_boundary.gpu_for_config(raw)

    run.main(["--config", str(path)])

    assert driver.names() == [
        "init_ray",
        "get_tokenizer",
        "setup_response_data",
        "setup",
        "grpo_train",
        *AFTER_TRAINING,
    ]
    events = dict(driver.events)
    if AFTER_TRAINING:  # the environments main() got from setup_response_data
        assert events["shutdown_environments"]["envs"] == driver.datasets[2:]
    # Ray workers inherit the driver's environment: this checkout is importable there.
    assert str(run.REPO_ROOT) in events["init_ray"]["env"]["PYTHONPATH"].split(os.pathsep)
    assert events["get_tokenizer"]["config"] == raw["policy"]["tokenizer"]

    setup = events["setup"]
    config = setup["config"]
    assert isinstance(config, grpo.MasterConfig)
    assert setup["tokenizer"] is driver.tokenizer
    assert (setup["dataset"], setup["val_dataset"]) == driver.datasets[:2]
    assert events["setup_response_data"]["data"] == raw["data"]
    assert events["setup_response_data"]["env"] == raw["env"]
    # policy.generation exactly as upstream's configure_generation_config makes it.
    expected_generation = configure_generation_config(
        copy.deepcopy(raw["policy"]["generation"]),
        Tokenizer(),
        has_refit_draft_weights=False,
        trains_mtp=bool(raw["policy"]["megatron_cfg"].get("mtp_num_layers")),
    )
    handed = setup["generation"]
    assert handed == expected_generation
    assert handed["_pad_token_id"] == Tokenizer.pad_token_id
    assert handed["stop_token_ids"] == [Tokenizer.eos_token_id]
    assert handed["vllm_cfg"]["load_format"] == "dummy"
    assert config.policy["draft"] == raw["policy"]["draft"]
    assert config.policy["draft"]["enabled"] is False
    # loss_fn view: loss_fn.ais owns the correction, so NeMo-RL's FP8 guard reads it as on.
    assert config.loss_fn.use_importance_sampling_correction is True
    assert raw["loss_fn"]["use_importance_sampling_correction"] is False
    assert callable(setup["policy_factory"])  # every arm, mode none included: the AIS worker
    # The next experiment directory under the configured log_dir (upstream's helper).
    assert config.logger["log_dir"] == os.path.join(raw["logger"]["log_dir"], "exp_001")

    args = events["grpo_train"]["args"]
    assert len(args) == 12
    loss_fn = args[5]
    assert isinstance(loss_fn, AISClippedPGLossFn)
    assert loss_fn.ais == ais_cfg.ais
    assert args[4] is driver.tokenizer
    assert args[6] is driver.datasets[2] and args[7] is driver.datasets[3]
    assert args[11] is config
    # what the real setup() returned reaches grpo_train, its ClippedPGLossFn swapped for ours
    returned = setup["returned"]
    assert args[0] is returned[0] and args[1] is returned[1] and args[2] is returned[4]
    assert type(returned[6]) is ClippedPGLossFn and loss_fn is not returned[6]
    assert args[8] is returned[7] and args[9] is returned[8] and args[10] is returned[9]
    # main's run_grpo.py stops the engines after training; so does main() on main
    stopped = [c for c in args[1].calls if c[0] == "shutdown"]
    assert stopped == per_version(v0_7_0=[], main=[("shutdown", ())])


def test_main_runs_async_grpo_with_the_ais_loss(driver):
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    # async GRPO needs a BF16 KV cache (upstream's setup asserts it; so does cluster_check)
    run.main(
        [
            "--config",
            str(path),
            "grpo.async_grpo.enabled=true",
            "grpo.async_grpo.max_trajectory_age_steps=2",
            "policy.generation.vllm_cfg.kv_cache_dtype=auto",
        ]
    )
    assert driver.names()[-1 - len(AFTER_TRAINING) :] == ["async_grpo_train", *AFTER_TRAINING]
    kwargs = driver.event("async_grpo_train")
    assert isinstance(kwargs["loss_fn"], AISClippedPGLossFn)
    assert kwargs["max_trajectory_age_steps"] == 2
    grpo_cfg = kwargs["master_config"].grpo  # v0.7.0: a dict; main: a pydantic model
    enabled = per_version(v0_7_0=lambda: grpo_cfg["async_grpo"]["enabled"], main=lambda: grpo_cfg.async_grpo.enabled)
    assert enabled() is True


def test_bad_ais_config_fails_before_ray(driver, monkeypatch, capsys):
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    with pytest.raises(ValueError, match=r"loss_fn\.ais\.weight_cap=0\.5 is invalid"):
        run.main(["--config", str(path), "loss_fn.ais.weight_cap=0.5"])
    with pytest.raises(run.ConfigError, match=r"loss_fn\.ais: expected a mapping"):
        run.main(["--config", str(path), "loss_fn.ais=ais"])  # a TypeError, as a ConfigError
    assert driver.events == []
    # as a script: one line and exit 2, not a traceback
    monkeypatch.setattr(sys, "argv", [str(LAUNCHER), "--config", str(path), "loss_fn.ais.weight_cap=0.5"])
    with pytest.raises(SystemExit, match="2"):
        runpy.run_path(str(LAUNCHER), run_name="__main__")
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("run_grpo_ais.py: invalid config: loss_fn.ais.weight_cap=0.5 is")
    assert not any("Traceback" in line for line in err) and driver.events == []


@pytest.mark.parametrize(
    ("config", "override", "error"),
    [
        ("qwen3_8b_2n8g_fp8.yaml", "ais_fp8_refit.backend=bogus", r"ais_fp8_refit\.backend='bogus' is invalid"),
        (
            "qwen3_8b_2n8g_fp8.yaml",
            "+ais_kv_calibration.reduction=bogus",
            r"ais_kv_calibration\.reduction='bogus' is invalid",
        ),
        (  # the NVFP4 refit's ignore list defaults from it: named, not "'int' object is not iterable"
            "experiments/qwen3_8b_nvfp4_w4a16_ais.yaml",
            "policy.generation.real_quant_ignore=5",
            r"policy\.generation\.real_quant_ignore=5 is invalid: expected a list of module-name patterns",
        ),
        (  # the offline check's fp8_rollout reports the same (test_cluster_configs)
            "experiments/smoke_bf16.yaml",
            "ais_fp8_refit.enabled=true",
            r"ais_fp8_refit\.enabled=True needs policy\.generation\.vllm_cfg\.precision: fp8 \(got 'bfloat16'\)",
        ),
    ],
)
def test_a_bad_refit_section_is_one_config_error_before_the_experiment_directory(
    driver, tmp_path, config, override, error
):
    path = CONFIG_DIR / config
    log_dir = tmp_path / "logs"
    with pytest.raises(run.ConfigError, match=error):
        run.main(["--config", str(path), f"logger.log_dir={log_dir}", override])
    assert driver.events == [] and not log_dir.exists()


@pytest.mark.parametrize("content", [None, "[1, 2]", '{"model.layers.0.mlp.down_proj": -1}'])
def test_a_w4a4_calibration_file_that_cannot_be_read_stops_main_before_ray(driver, tmp_path, content):
    """Missing, not an object, or a negative amax: one config error before Ray (else every engine refuses to arm)."""
    path = tmp_path / "calibration" / "mine.json"
    if content is not None:
        path.write_text(content)
    argv = ["--config", str(CONFIG_DIR / "experiments" / "qwen3_8b_nvfp4_w4a4_ais.yaml")]
    argv.append(f"ais_nvfp4_refit.input_amax_file={path}")
    refused = per_version(
        v0_7_0=r"needs NeMo-RL main",  # the format itself, first
        main=rf"ais_nvfp4_refit\.input_amax_file {path}: (cannot read it|got a JSON list|.*is -1, expected one finite)",
    )
    with pytest.raises(run.ConfigError, match=refused):
        run.main(argv)
    assert driver.events == []


def test_help_is_parsed_before_nemo_rl_is_imported():
    """--help answers before NeMo-RL is imported: fast, and on a login node without it."""
    code = (
        "import importlib.util, runpy, sys\n"
        "assert importlib.util.find_spec('nemo_rl') is not None  # the vendored NeMo-RL\n"
        f"sys.argv = [{str(LAUNCHER)!r}, '--help']\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "finally:\n"
        "    print('NEMO_RL_IMPORTED', 'nemo_rl' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "NEMO_RL_IMPORTED False" in res.stdout
    text = " ".join(res.stdout.split())  # argparse wraps the epilog
    assert "--config CONFIG" in text and "key=value, +new.key=value, ~key" in text


def test_data_plane_is_refused_before_ray_for_every_mode(driver):
    # Upstream's run_grpo.py builds TQPolicy and runs grpo_train_sync for data_plane.enabled;
    # the AIS worker is not composed with TQPolicy, so every arm refuses it, before Ray starts.
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    for mode in ("none", "tis", "ais"):
        with pytest.raises(ValueError, match=r"data_plane\.enabled=true .*set data_plane\.enabled=false"):
            run.main(["--config", str(path), f"loss_fn.ais.mode={mode}", "+data_plane.enabled=true"])
    assert driver.events == []


def test_val_at_start_with_fp8_kv_cache_is_refused_before_ray(driver):
    # grpo_train refits for the initial validation before any KV calibration (v0.7.0):
    # the worker's guard would stop that refit on the cluster; the launcher stops it here.
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    with pytest.raises(ValueError, match=r"grpo\.val_at_start=true with .*kv_cache_dtype='fp8'"):
        run.main(["--config", str(path), "grpo.val_at_start=true"])
    assert driver.events == []
    # a BF16 KV cache (the bf16 arm) needs no calibration: accepted, reaches setup()
    bf16 = CONFIG_DIR / "experiments" / "smoke_bf16.yaml"
    run.main(["--config", str(bf16), "grpo.val_at_start=true"])
    assert driver.names()[-2 - len(AFTER_TRAINING) :] == ["setup", "grpo_train", *AFTER_TRAINING]


def test_a_vllm_worker_without_the_fp8_refit_stops_main_before_training(driver, monkeypatch):
    # the launcher armed the refit, but its environment never reached the workers (e.g. a
    # cluster that rebuilds the worker environment): main() must stop, naming the worker
    real = run.configure_fp8_refit
    monkeypatch.setattr(run, "configure_fp8_refit", lambda raw: real(raw, {"PYTHONPATH": ""}))
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    with pytest.raises(RuntimeError, match=r"generation worker 0, vLLM process \d+ on .*: "):
        run.main(["--config", str(path)])
    assert "grpo_train" not in driver.names()


def test_a_w4a4_or_mxfp8_rollout_on_hopper_stops_main_before_training(driver):
    # vLLM would run the NVFP4 W4A4 arm as W4A16 (Marlin) on an H100, silently: the
    # engines' GPUs are asked after setup() and main() stops, naming format and GPU
    # (v0.7.0 has neither format: refused before Ray, as test_setup_real.py checks)
    refused = per_version(v0_7_0=(ValueError, "needs NeMo-RL main"), main=(RuntimeError, "natively"))
    for name in ("qwen3_8b_nvfp4_w4a4_ais.yaml", "qwen3_8b_mxfp8_ais.yaml"):
        driver.events.clear()
        with pytest.raises(refused[0], match=refused[1]) as err:
            run.main(["--config", str(CONFIG_DIR / "experiments" / name)])
        assert "grpo_train" not in driver.names()
        if NEMO_RL == "main":
            assert "NVIDIA H100 80GB HBM3 has 9.0" in str(err.value)
            assert "compute capability >= 10.0" in str(err.value)
            assert driver.names()[-1] == "setup"  # after setup(), before any training


def test_a_cluster_of_hopper_nodes_stops_a_w4a4_run_before_setup(driver, monkeypatch):
    # every Ray node reads its GPUs by NVML right after init_ray(): an all-Hopper cluster
    # cannot run W4A4 natively anywhere, so main() stops before setup() loads any engine
    from nemo_ais.nemo_rl import engine_report

    h100 = _ray_boundary.H100  # the reader runs in a Ray task: it carries the value
    monkeypatch.setattr(engine_report, "nvml_gpus", lambda visible: [h100] * 8)
    path = CONFIG_DIR / "experiments" / "qwen3_8b_nvfp4_w4a4_ais.yaml"
    if NEMO_RL == "v0.7.0":  # no W4A4 there: refused before Ray (test_setup_real.py)
        with pytest.raises(ValueError, match="needs NeMo-RL main"):
            run.main(["--config", str(path)])
        return
    with pytest.raises(RuntimeError, match="Refused before setup") as err:
        run.main(["--config", str(path)])
    assert "8 x NVIDIA H100 80GB HBM3 (compute capability 9.0)" in str(err.value)
    assert driver.names() == ["init_ray"]  # no tokenizer, no data, no setup()
    # a BF16 or FP8 rollout runs on the same nodes
    driver.events.clear()
    run.main(["--config", str(CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml")])
    assert "setup" in driver.names()


def test_after_the_first_refit_main_checks_every_engine_layer_once(driver, monkeypatch):
    refits = []
    monkeypatch.setattr(grpo, "refit_policy_generation", lambda *a, **k: refits.append(len(refits)) or {})
    run.main(["--config", str(CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml")])
    wrapped = grpo.refit_policy_generation
    assert wrapped.__wrapped__ is not None  # installed by main(), around upstream's name
    generation = driver.events[-1 - len(AFTER_TRAINING)][1]["args"][1]
    before = list(generation.calls)
    wrapped("policy", generation, True)  # grpo_train's first refit
    wrapped("policy", generation, True)
    assert refits == [0, 1]
    asked = [c for c in generation.calls[len(before) :] if c[0] == "__ray_call__"]
    assert asked == [("__ray_call__", "_engine_layers_all")]  # after the first refit only


def test_bypass_makes_upstreams_grpo_train_skip_the_prev_logprobs_forward(driver):
    # loss_fn.ais.bypass (pi_old := mu): the config grpo_train gets turns on NeMo-RL's own
    # skip, judged by upstream's predicate; the loss that trains is ours, with bypass on
    from nemo_rl.algorithms import opd

    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    run.main(["--config", str(path), "loss_fn.ais.bypass=true"])
    args = driver.event("grpo_train")["args"]
    loss_fn, master_config = args[5], args[11]
    assert opd._skip_prev_logprobs(master_config) is True
    assert isinstance(loss_fn, AISClippedPGLossFn) and loss_fn.ais.bypass is True
    assert loss_fn.force_on_policy_ratio is False  # the user's config: upstream's ratio=1 is off
    driver.events.clear()
    run.main(["--config", str(path)])  # without bypass: the forward runs
    assert opd._skip_prev_logprobs(driver.event("grpo_train")["args"][11]) is False


def test_bypass_with_several_updates_per_rollout_batch_is_refused_before_ray(driver):
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    with pytest.raises(ValueError, match=r"policy\.train_global_batch_size=16 must equal grpo"):
        run.main(["--config", str(path), "loss_fn.ais.bypass=true", "policy.train_global_batch_size=16"])
    assert driver.events == []
