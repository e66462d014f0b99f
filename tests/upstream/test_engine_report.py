# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""What each vLLM worker holds, against the run's keep-in-BF16 rule and the GPU's kernels.

Issue 27 items 3, 5 and 9: a W4A4 rollout on Hopper that vLLM silently runs as W4A16
(Marlin), NVFP4 experts that NeMo-RL v0.7.0 never re-processes after a refit, and an
engine ignore entry that also keeps a fused layer in BF16 (veRL #7519's ``mlp.gate`` /
``mlp.gate_up_proj``). The driver side goes through upstream's REAL dispatch
(``VllmGeneration.worker_group``, a real ``RayWorkerGroup`` over Ray actors,
``run_all_workers_single_data("__ray_call__", ...)``); stood in, recording what crosses:
the generation worker actor and vLLM's ``collective_rpc`` (``_generation_worker``) and
vLLM's quant-method classes (``tests/_vllm_layers.py``, named as vLLM's).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import sys
import types
from pathlib import Path

import pytest
import ray

from nemo_ais.nemo_rl import engine_report as er

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _generation_worker import AsyncGenerationWorker, AsyncLLM, GenerationWorker, generation_over
from _vllm_layers import METHODS, Worker, dense_spec

pytestmark = pytest.mark.nemo_rl

REPO_ROOT = Path(__file__).resolve().parents[2]
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
B200 = ("NVIDIA B200", (10, 0))


def _router_rule(name: str) -> bool:
    """The run's rule: routers (a whole last name part) stay BF16 (rules.keep_bf16's rule 1)."""
    return name.removesuffix(".weight").rpartition(".")[2] in {"gate", "router"}


def _report(spec, gpu=H100) -> er.EngineLayers:
    local = er.engine_layers(Worker(spec))
    return local._replace(device=gpu[0], capability=gpu[1])


@pytest.mark.parametrize(
    ("method", "held"),
    [
        ("bf16", "bf16"),
        ("bf16_moe", "bf16"),
        ("embedding", "bf16"),
        ("nvfp4_cutlass", "nvfp4_w4a4"),
        ("nvfp4_marlin", "nvfp4_w4a16"),
        ("nvfp4_nemo_w4a16", "nvfp4_w4a16"),
        ("nvfp4_moe_cutlass", "nvfp4_w4a4"),
        ("nvfp4_moe_marlin", "nvfp4_w4a16"),
        ("mxfp8_cutlass", "mxfp8"),
        ("mxfp8_marlin", "mxfp8_weight_only"),
        ("fp8_cutlass", "fp8"),
        ("fp8_marlin", "fp8_weight_only"),
    ],
)
def test_the_held_format_comes_from_the_method_and_its_kernel(method, held):
    assert er.held_format(METHODS[method]()) == held


def test_an_unknown_method_is_named_not_guessed():
    class SomeNewMethod:
        pass

    assert er.held_format(SomeNewMethod()) == "unknown:SomeNewMethod"
    # a vLLM release that renames a method is refused, not guessed
    layer = er.HeldLayer("model.layers.0.mlp.down_proj", "SomeNewMethod", "unknown:SomeNewMethod", False)
    report = er.EngineLayers(1, "host", *B200, (layer,))
    (problem,) = er.format_problems("fp8", [report], _router_rule, nemo_rl_version="main")
    assert "down_proj is held as unknown:SomeNewMethod (SomeNewMethod), expected fp8" in problem


def test_a_w4a4_rollout_on_hopper_is_refused_naming_the_gpu_and_capability():
    report = _report(dense_spec(2, "nvfp4_marlin"))
    (gpu,) = er.gpu_problems("nvfp4_w4a4", [report])
    assert "nvfp4_w4a4 needs a GPU of compute capability >= 10.0" in gpu
    assert "NVIDIA H100 80GB HBM3 has 9.0" in gpu and "W4A16" in gpu
    assert er.gpu_problems("nvfp4_w4a4", [_report({}, B200)]) == []
    assert er.gpu_problems("nvfp4_w4a16", [report]) == []  # Marlin is W4A16's own kernel
    assert er.gpu_problems("bf16", [report]) == []
    # after the refit: every quantized layer runs the weight-only kernel, each named
    problems = er.format_problems("nvfp4_w4a4", [report], _router_rule, nemo_rl_version="main")
    assert len(problems) == 2 * 4
    assert all("runs nvfp4_w4a16 (ModelOptNvFp4LinearMethod)" in p for p in problems)
    assert "model.layers.1.mlp.down_proj runs nvfp4_w4a16" in "\n".join(problems)
    assert "activations are not quantized" in problems[0]


def test_mxfp8_and_fp8_on_gpus_without_their_kernels():
    assert er.gpu_problems("mxfp8", [_report({}, H100)])
    assert er.gpu_problems("fp8", [_report({}, H100)]) == []
    assert er.gpu_problems("fp8", [_report({}, ("NVIDIA A100", (8, 0)))])
    report = _report(dense_spec(1, "fp8_marlin"), ("NVIDIA A100", (8, 0)))
    problems = er.format_problems("fp8", [report], _router_rule, nemo_rl_version="v0.7.0")
    assert problems and all("runs fp8_weight_only" in p for p in problems)


def test_a_prefix_collision_in_the_engine_is_refused_naming_the_layer():
    # the engine's ignore entry model.layers.1.mlp.gate (the router) matched as a substring
    # also kept model.layers.1.mlp.gate_up_proj in BF16; the run quantizes it
    spec = dense_spec(2, "nvfp4_cutlass")
    spec["model.layers.1.mlp.gate_up_proj"] = "bf16"
    report = _report(spec, B200)
    problems = er.format_problems("nvfp4_w4a4", [report], _router_rule, nemo_rl_version="main")
    (problem,) = problems
    assert "model.layers.1.mlp.gate_up_proj is held in BF16 (UnquantizedLinearMethod)" in problem
    assert "the run quantizes it to nvfp4_w4a4" in problem
    # every other layer agrees (the fused layer of layer 0 and the routers included)
    assert sum(layer.held == "bf16" for layer in report.layers) == 3  # embed, lm_head, 1.gate_up


def test_a_layer_the_run_keeps_in_bf16_but_the_engine_quantizes():
    spec = dense_spec(2, "fp8_cutlass")
    problems = er.format_problems("fp8", [_report(spec)], lambda n: ".layers.0." in n, nemo_rl_version="main")
    assert len(problems) == 4  # the four linears of layer 0
    assert all("layers.0." in p and "but the run keeps it in BF16" in p for p in problems)
    assert er.expects_bf16(lambda n: False, "lm_head")  # outside the decoder: BF16
    assert er.expects_bf16(lambda n: n.endswith("q_proj"), "model.layers.0.self_attn.qkv_proj") is False


def test_nvfp4_experts_are_refused_on_v0_7_0_only():
    spec = {
        "model.layers.0.self_attn.qkv_proj": "nvfp4_cutlass",
        "model.layers.0.mlp.gate": "bf16",
        "model.layers.0.mlp.experts": "nvfp4_moe_cutlass",
    }
    report = _report(spec, B200)
    (problem,) = er.format_problems("nvfp4_w4a4", [report], _router_rule, nemo_rl_version="v0.7.0")
    assert "model.layers.0.mlp.experts is an NVFP4 expert stack: NeMo-RL v0.7.0" in problem
    assert er.format_problems("nvfp4_w4a4", [report], _router_rule, nemo_rl_version="main") == []


# --- the driver side, through upstream's real dispatch ------------------------------------


# the stand-in actors' Ray processes import the repo, tests/ and tests/upstream/
ACTOR_ENV = {"env_vars": {"PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(REPO_ROOT), str(REPO_ROOT / "tests"), str(REPO_ROOT / "tests" / "upstream")])}}  # fmt: skip
GOOD = dense_spec(2, "fp8_cutlass")
COLLIDED = {**GOOD, "model.layers.1.mlp.gate_up_proj": "bf16"}  # veRL #7519's collision


@pytest.fixture(scope="module")
def engines(local_ray):
    actors = {
        name: GenerationWorker.options(runtime_env=ACTOR_ENV).remote(model_spec=spec)
        for name, spec in (("good", GOOD), ("collided", COLLIDED))
    }
    yield actors
    for actor in actors.values():
        ray.kill(actor)


def test_the_driver_reads_every_engine_after_the_refit(engines):
    generation = generation_over([engines["good"]])
    (report,) = er.require_engine_formats(generation, "fp8", _router_rule, nemo_rl_version="main")
    assert report.pid != os.getpid()  # read in the engine's process
    assert len(report.layers) == 2 * 4 + 2
    assert {layer.held for layer in report.layers} == {"fp8", "bf16"}
    assert ray.get(engines["good"].rpc_calls.remote())[-1] == "engine_layers"


def test_the_driver_refuses_a_collision_in_one_engine_naming_it(engines):
    generation = generation_over([engines["good"], engines["collided"]])
    with pytest.raises(RuntimeError, match="do not hold what the run quantizes") as err:
        er.require_engine_formats(generation, "fp8", _router_rule, nemo_rl_version="main")
    message = str(err.value)
    assert "1 problem(s)" in message
    assert "model.layers.1.mlp.gate_up_proj is held in BF16" in message


@pytest.fixture(scope="module")
def async_engines(local_ray):
    specs = {
        "good": (GOOD, "handler"),
        "collided": (COLLIDED, "handler"),
        "no_output_task": (GOOD, "none"),
        "resources_only": (GOOD, "resources"),
        "dead": (GOOD, "dead"),
        "silent": (GOOD, "silent"),
    }
    actors = {
        name: AsyncGenerationWorker.options(runtime_env=ACTOR_ENV).remote(spec, mode)
        for name, (spec, mode) in specs.items()
    }
    yield actors
    for actor in actors.values():
        ray.kill(actor)


def test_an_async_engine_is_read_on_its_own_event_loop(async_engines):
    # __ray_call__ runs outside the async actor's loop; the engine answers only on its own
    for name in ("good", "resources_only"):  # output_handler, or the client's output task
        generation = generation_over([async_engines[name]])
        (report,) = er.require_engine_formats(generation, "fp8", _router_rule, nemo_rl_version="main")
        assert report.pid != os.getpid() and len(report.layers) == 2 * 4 + 2
        assert ray.get(async_engines[name].rpc_calls.remote())[-1] == "engine_layers"
    generation = generation_over([async_engines["good"], async_engines["collided"]])
    with pytest.raises(RuntimeError, match="1 problem") as err:
        er.require_engine_formats(generation, "fp8", _router_rule, nemo_rl_version="main")
    assert "model.layers.1.mlp.gate_up_proj is held in BF16" in str(err.value)


def test_an_async_engine_without_its_output_task_is_named_unreachable(async_engines):
    generation = generation_over([async_engines["no_output_task"]])
    with pytest.raises(er.AsyncEngineUnreachable, match=r"no running output task") as err:
        er.require_engine_formats(generation, "fp8", _router_rule, nemo_rl_version="main")
    assert "collective_rpc(engine_layers)" in str(err.value)
    assert ray.get(async_engines["no_output_task"].rpc_calls.remote()) == []  # never called


def test_an_unreachable_async_engine_hides_no_problem_of_the_others(async_engines):
    generation = generation_over([async_engines["no_output_task"], async_engines["collided"]])
    with pytest.raises(RuntimeError, match="1 problem") as err:
        er.require_engine_formats(generation, "fp8", _router_rule, nemo_rl_version="main")
    assert not isinstance(err.value, er.AsyncEngineUnreachable)
    assert "model.layers.1.mlp.gate_up_proj is held in BF16" in str(err.value)
    assert "not read: the async vLLM engine in generation actor pid" in str(err.value)


def test_a_dead_or_silent_async_engine_stops_the_check(async_engines):
    generation = generation_over([async_engines["dead"]])
    with pytest.raises(RuntimeError, match=r"is dead \(AsyncLLM.errored\)") as err:
        er.require_engine_formats(generation, "fp8", _router_rule, nemo_rl_version="main")
    assert not isinstance(err.value, er.AsyncEngineUnreachable)
    rpc = functools.partial(er.engine_rpc, method=er.engine_layers, timeout_s=1.0)
    with pytest.raises(TimeoutError, match=r"collective_rpc\(engine_layers\) on the async .* 1 s"):
        ray.get(async_engines["silent"].__ray_call__.remote(rpc))


def test_engine_rpc_refuses_to_wait_on_the_loop_it_would_block():
    async def on_the_engines_loop():
        llm = AsyncLLM()  # its output task runs on this loop
        with pytest.raises(RuntimeError, match="called on the event loop of the async vLLM"):
            er.engine_rpc(types.SimpleNamespace(llm=llm), er.engine_layers)
        llm.output_handler.cancel()
        assert llm.calls == []

    asyncio.run(on_the_engines_loop())


def test_the_launchers_first_refit_check_reads_async_engines_or_warns(async_engines, caplog):
    from shipped_configs import CONFIG_DIR, launcher

    run = launcher()
    raw = run.load_config_dict(
        str(CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"), ["policy.generation.vllm_cfg.async_engine=true"]
    )
    refits = []
    for name, outcome in (("collided", "refuse"), ("no_output_task", "warn"), ("good", "pass")):
        grpo = types.SimpleNamespace(refit_policy_generation=lambda *a: refits.append(a) or "out")
        generation = generation_over([async_engines[name]])
        run.check_engines_after_first_refit(grpo, raw, generation, None, "main")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nemo_ais.nemo_rl.engine_report"):
            if outcome == "refuse":
                with pytest.raises(RuntimeError, match="gate_up_proj is held in BF16"):
                    grpo.refit_policy_generation("policy", generation, True)
                continue
            assert grpo.refit_policy_generation("policy", generation, True) == "out"
        if outcome == "warn":
            assert "layer formats are not read after the first refit" in caplog.text
            assert "no running output task" in caplog.text
        else:
            assert "after the first refit 1 vLLM worker processes hold fp8" in caplog.text
    assert len(refits) == 3  # the refit itself ran every time, before the check


def test_the_driver_refuses_a_format_the_engines_gpu_cannot_run(engines):
    generation = generation_over([engines["good"]])
    with pytest.raises(RuntimeError, match="cannot run nvfp4_w4a4 natively") as err:
        er.require_native_gpu(generation, "nvfp4_w4a4")
    assert "no GPU has none" in str(err.value)  # this CPU actor has no CUDA device
    assert er.require_native_gpu(generation, "bf16")[0].capability is None


# --- before setup(): the Ray cluster's GPUs, read by NVML on each node ---------------------


def test_a_cluster_without_a_native_gpu_is_refused_before_setup(local_ray):
    hopper = lambda visible: [H100, H100, ("NVIDIA H200", (9, 0))]  # noqa: E731 (by value)
    with pytest.raises(RuntimeError, match="Refused before setup") as err:
        er.require_native_nodes("nvfp4_w4a4", read=hopper)
    message = str(err.value)
    assert "nvfp4_w4a4 needs a GPU of compute capability >= 10.0 (Blackwell (SM100))" in message
    host = socket.gethostname()  # the node's own name, read in a Ray task on it
    assert f"{host}: 2 x NVIDIA H100 80GB HBM3 (compute capability 9.0), 1 x NVIDIA H200" in message
    assert "weight-only Marlin NVFP4 (W4A16)" in message
    with pytest.raises(RuntimeError, match=r"mxfp8 needs a GPU of compute capability >= 10\.0"):
        er.require_native_nodes("mxfp8", read=hopper)
    # Hopper runs block FP8 and NVFP4 W4A16 natively; bf16 has no kernel to check
    assert er.require_native_nodes("fp8", read=hopper) == {host: [H100, H100, ("NVIDIA H200", (9, 0))]}
    assert er.require_native_nodes("nvfp4_w4a16", read=hopper)[host][0] == H100
    assert er.require_native_nodes("bf16", read=hopper) == {}


def test_a_cluster_with_a_native_gpu_or_none_read_is_left_to_the_engines(local_ray, caplog):
    blackwell = lambda visible: [B200]  # noqa: E731
    assert er.require_native_nodes("nvfp4_w4a4", read=blackwell) == {socket.gethostname(): [B200]}
    unreadable = lambda visible: None  # noqa: E731 (no NVIDIA driver on the node)
    with caplog.at_level("WARNING", logger=er.logger.name):
        assert er.require_native_nodes("nvfp4_w4a4", read=unreadable) == {}
    assert "NVML read no GPU on the 1 Ray node(s)" in caplog.text
    assert "checked for nvfp4_w4a4 after setup()" in caplog.text


def test_nvml_is_read_for_the_visible_gpus_by_index_or_uuid(monkeypatch):
    calls = []

    class Nvml:  # NVML, the driver library a CPU machine lacks: records what crosses
        def __getattr__(self, name):
            def call(*args):
                calls.append((name, args))
                if args == ("MIG-0",):
                    raise RuntimeError("NVML_ERROR_NOT_FOUND")  # pynvml's NVMLError
                return {
                    "nvmlDeviceGetCount": 2,
                    "nvmlDeviceGetName": b"NVIDIA H100 80GB HBM3" if args == ("h1",) else "NVIDIA B200",
                    "nvmlDeviceGetCudaComputeCapability": (9, 0) if args == ("h1",) else (10, 0),
                    "nvmlDeviceGetHandleByIndex": f"h{args[0]}" if args else None,
                    "nvmlDeviceGetHandleByUUID": "hu",
                }.get(name)

            return call

    monkeypatch.setitem(sys.modules, "pynvml", Nvml())
    assert er.nvml_gpus("1, GPU-5f2c") == [H100, B200]
    assert ("nvmlDeviceGetHandleByIndex", (1,)) in calls
    assert ("nvmlDeviceGetHandleByUUID", ("GPU-5f2c",)) in calls
    assert [c[0] for c in calls][:: len(calls) - 1] == ["nvmlInit", "nvmlShutdown"]
    calls.clear()
    assert er.nvml_gpus(None) == [("NVIDIA B200", (10, 0)), H100]  # every GPU: h0, h1
    assert er.nvml_gpus("MIG-0") is None  # a handle NVML refuses: not readable, no error
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: not readable, no error
    assert er.nvml_gpus(None) is None


def test_an_async_engine_is_checked_by_its_actors_gpus_without_collective_rpc(engines, caplog):
    generation = generation_over([engines["good"]])
    before = ray.get(engines["good"].rpc_calls.remote())
    hopper = lambda visible: [H100]  # noqa: E731
    with pytest.raises(RuntimeError, match="cannot run nvfp4_w4a4 natively") as err:
        er.require_native_gpu(generation, "nvfp4_w4a4", async_engine=True, read=hopper)
    assert "NVIDIA H100 80GB HBM3 has 9.0" in str(err.value)
    named = lambda visible: [(f"visible={visible}", (9, 0))]  # noqa: E731 (what it was asked)
    (report,) = er.require_native_gpu(generation, "fp8", async_engine=True, read=named)
    assert report.pid != os.getpid() and report.capability == (9, 0)  # the actor's process
    assert report.device == "visible=None"  # no CUDA_VISIBLE_DEVICES on this CPU actor: all
    assert ray.get(engines["good"].rpc_calls.remote()) == before  # no collective_rpc call
    with caplog.at_level("WARNING", logger=er.logger.name):
        assert er.require_native_gpu(generation, "fp8", async_engine=True, read=lambda v: None) == []
    assert "NVML could not be read in the async generation workers" in caplog.text


def test_an_async_engine_over_two_tensor_parallel_actors_asks_both(engines):
    # one engine spanning two actors (TP 2): the sync check asks the TP rank 0 (its vLLM
    # workers answer for the rest); the async check reads each actor's node by NVML
    generation = generation_over([engines["good"], engines["collided"]], layout=[[[0, 1]]])
    named = lambda visible: [(f"visible={visible}", (9, 0))]  # noqa: E731
    assert len(er.require_native_gpu(generation, "fp8", async_engine=True, read=named)) == 2
    assert len(er.require_native_gpu(generation, "bf16")) == 1  # bf16: nothing to refuse
