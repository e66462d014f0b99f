# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""FP8 KV-cache scales: calibrated as upstream calibrates (issue 18, item 2), and reaching vLLM
through upstream's real refit (issue 11, defect 3).

Calibration: NeMo-RL's REAL ``MegatronPolicyWorkerImpl.calibrate_qkv_fp8_scales`` (v0.7.0
and main; the session's ``--nemo-rl``) runs on a stand-in ``self`` that replays the Q/K/V
which our worker's calibration saw at every ``core_attention`` call of a real megatron-core
``GPTModel`` (several micro-batches), and on synthetic heavy-tailed Q/K/V with 600
micro-batches (where upstream's nearest-rank percentile is below the max). Our default rule
gives exactly upstream's scales; ``element_percentile`` gives smaller ones. Only CUDA is
stubbed (``torch.tensor(..., device="cuda")`` in upstream's module lands on the CPU). The
stand-in's ``core_attention`` has no child modules: upstream hooks every module whose name
CONTAINS ``self_attention.core_attention``, so on megatron-core's local spec it also hooks
the softmax and dropout children and fails (pinned below); on Transformer Engine's spec the
children are the attention backends, called with the same q/k/v (duplicate observations).

What runs for real:

* NeMo-RL v0.7.0's ``grpo.refit_policy_generation`` (colocated and not), its ``Policy``
  (built with ``Policy.__new__``: its ``__init__`` starts Ray actors on GPUs) and its
  ``RayWorkerGroup`` dispatch (``run_all_workers_single_data`` / ``_sharded_data`` /
  ``MultiWorkerFuture``, built with ``__new__``), ``Policy.calibrate_qkv_fp8_scales``;
* upstream's ``MegatronPolicyWorkerImpl.stream_weights_via_ipc_zmq`` /
  ``broadcast_weights_for_collective`` / ``_iter_params_with_optional_kv_scales`` (where
  the q/k/v scales are merged into the streamed tensors);
* our ``AISMegatronPolicyWorker`` (the class under ``@ray.remote``, via
  ``__ray_actor_class__``, built with ``__new__``) and its KV calibration, on a tiny
  megatron-core 0.16.1 ``GPTModel`` (GQA, q/k-norm, RoPE; fp32 on CPU, one gloo rank).

Stubbed, each at the narrowest boundary and recording what crosses it:

* the Ray actor: an in-process handle runs the real worker method and returns
  ``ray.put(result)``; the GPU-memory methods (``offload_before_refit``,
  ``offload_after_refit``, ``get_free_memory_bytes``) are recorded and not run;
* the transport: ``stream_weights_via_ipc_zmq_impl`` (CUDA IPC over ZMQ) and
  ``packed_broadcast_producer`` (NCCL) record every ``(name, tensor)`` and hand them to
* the vLLM side (``VllmGeneration`` cannot run on CPU): records what it receives;
* the forward pass of ``get_logprobs`` (Megatron pipeline schedule on CUDA) is the tiny
  model's forward over the shard it is given; ``megatron_bridge`` (Megatron-Bridge is not
  installable on CPU: it needs Transformer Engine and ``transformers<5``) exports the
  model's parameters and gives the transformer config;
* CUDA-only calls: ``torch.tensor(..., device="cuda")`` inside upstream's worker module
  lands on CPU (that module's ``torch`` name only; counted), NVTX ranges are no-ops, RoPE's ``torch.cuda.current_device()`` is ``"cpu"``, no CUDA RNG tracker;
* import-time placeholders so upstream's worker module imports (``tests/_megatron_worker.py``):
  ``megatron.bridge.*`` and four names megatron-core 0.16.1 lacks (v0.7.0 builds against a
  newer one). Each placeholder raises if it is ever called; the test asserts none was.
"""

from __future__ import annotations

import contextlib
import types

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
import ray
import torch
import torch.distributed as dist
from _megatron_worker import Placeholder, megatron_worker_modules
from nemo_rl_version import per_version

from nemo_ais.megatron.kv_calibration import KV_REDUCTION_ENV, find_attention_layers
from nemo_ais.refit.kv_scales import verify_kv_scales

pytestmark = [pytest.mark.nemo_rl, pytest.mark.megatron]

GPU_ONLY_METHODS = ("offload_before_refit", "offload_after_refit", "get_free_memory_bytes")
LAYERS, HIDDEN, HEADS, GROUPS, VOCAB, SEQ = 2, 32, 4, 2, 64, 8


@pytest.fixture(scope="module")
def worker_modules():
    """Upstream's real Megatron worker module and ours, importable on CPU."""
    with megatron_worker_modules() as modules:
        yield modules


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


# ---- CUDA-only calls --------------------------------------------------------------------------


class _HostTorch:
    """``torch`` as upstream's worker MODULE sees it (its global name ``torch``, nowhere else):
    ``torch.tensor(..., device="cuda")`` lands on the CPU and is counted; every other
    attribute is torch's own."""

    def __init__(self, record: dict) -> None:
        self._record = record

    def tensor(self, *args, device=None, **kwargs):
        if device is not None and str(device).startswith("cuda"):
            self._record["cuda_tensors"] += 1
            device = "cpu"
        return torch.tensor(*args, device=device, **kwargs)

    def __getattr__(self, name: str):
        return getattr(torch, name)


@pytest.fixture
def cpu_shims(monkeypatch, worker_modules):
    import megatron.core.tensor_parallel as tp

    record = {"cuda_tensors": 0, "nvtx": []}
    monkeypatch.setattr(worker_modules.upstream, "torch", _HostTorch(record))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", record["nvtx"].append)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # RoPE's inv_freq.to()
    tracker = types.SimpleNamespace(fork=lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(tp, "get_cuda_rng_tracker", lambda *a, **k: tracker)
    return record


@pytest.fixture
def one_rank(tmp_path):
    """One gloo rank with megatron-core's model-parallel groups (TP = PP = 1).

    A file rendezvous, not a TCP port picked in advance: another process (Ray starts
    many) can take such a port between the pick and the bind (EADDRINUSE, seen in CI).
    """
    from megatron.core import parallel_state

    store = tmp_path / "gloo_store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(create_gloo_process_groups=False)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _gpt():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_query_groups=GROUPS,
        qk_layernorm=True,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )
    torch.manual_seed(1234)
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=get_gpt_layer_local_spec(qk_layernorm=True),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        position_embedding_type="rope",
    )
    return model.eval(), cfg


# ---- the stand-ins ----------------------------------------------------------------------------


class _Bridge:
    """Megatron-Bridge's ``AutoBridge``: transformer config + HF export of the model."""

    def __init__(self, model, transformer_config) -> None:
        self.model, self.transformer_config = model, transformer_config
        self.exports = 0

    def export_hf_weights(self, models, show_progress=False, conversion_tasks=None):
        assert models == [self.model]
        self.exports += 1
        for name, param in self.model.named_parameters():
            yield name, param.detach()


class _VllmSide:
    """The generation engine: records the tensors the transport delivers to it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.inbox: list[tuple[str, torch.Tensor]] = []
        self.received: list[tuple[str, torch.Tensor]] = []

    def prepare_for_generation(self, tags=None):
        self.calls.append(("prepare_for_generation", tags))

    def _update(self, method: str) -> list:
        self.calls.append((method,))
        self.received, self.inbox = self.inbox, []
        return [ray.put(bool(self.received))]

    def update_weights_via_ipc_zmq(self):
        return self._update("update_weights_via_ipc_zmq")

    def update_weights_from_collective(self):
        return self._update("update_weights_from_collective")

    def scales(self) -> dict[str, float]:
        return {n: float(t) for n, t in self.received if n.endswith("_scale")}


class _ActorHandle:
    """A Ray actor handle over an in-process worker: ``handle.method.remote(**kw)``.

    Top-level ``ObjectRef`` arguments are resolved as Ray does; the result is
    ``ray.put``; an exception propagates at ``.remote()`` (Ray raises it at ``ray.get``).
    """

    def __init__(self, worker) -> None:
        self.worker, self.calls = worker, []

    def __getattr__(self, method: str):
        def remote(*args, **kwargs):
            args = [ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args]
            kwargs = {k: ray.get(v) if isinstance(v, ray.ObjectRef) else v for k, v in kwargs.items()}
            self.calls.append((method, kwargs))
            if method in GPU_ONLY_METHODS:
                return ray.put(None)
            return ray.put(getattr(self.worker, method)(*args, **kwargs))

        return types.SimpleNamespace(remote=remote)


def _worker(worker_modules, kv_cache_dtype: str):
    """Our real worker class, built without its GPU ``__init__``."""
    cls = worker_modules.ours.AISMegatronPolicyWorker.__ray_actor_class__
    assert issubclass(cls, worker_modules.upstream.MegatronPolicyWorkerImpl)
    worker = cls.__new__(cls)
    model, transformer_config = _gpt()
    worker.cfg = {"generation": {"backend": "vllm", "vllm_cfg": {"kv_cache_dtype": kv_cache_dtype}}}
    worker.model = model
    worker.megatron_bridge = _Bridge(model, transformer_config)
    worker.refit_conversion_tasks = None
    worker.draft_model = None
    worker.rank = 0
    worker.zmq_socket = "zmq-socket"  # maybe_init_zmq() keeps an existing socket
    worker.model_update_group = "nccl-group"
    worker.forward_calls = []

    def get_logprobs(*, data, micro_batch_size=None, require_router_replay=True):
        # the forward of upstream's get_logprobs (a Megatron schedule on CUDA)
        worker.forward_calls.append((data["input_ids"].clone(), require_router_replay))
        ids = data["input_ids"]
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        mask = torch.ones(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool).triu(1)
        return model(ids, pos, mask)

    worker.get_logprobs = get_logprobs
    return worker


@pytest.fixture
def make_policy():
    """Upstream's real ``Policy`` over upstream's real ``RayWorkerGroup`` dispatch."""
    policies = []
    yield lambda worker: _policy(worker, policies)
    for policy in policies:  # Policy.__del__ would shut the (stand-in) actors down
        del policy.worker_group


def _policy(worker, policies):
    from nemo_rl.distributed.named_sharding import NamedSharding
    from nemo_rl.distributed.worker_groups import RayWorkerGroup
    from nemo_rl.models.policy.lm_policy import Policy

    sharding = NamedSharding(
        layout=[[[[0]]]], names=["pipeline_parallel", "data_parallel", "context_parallel", "tensor_parallel"]
    )
    group = RayWorkerGroup.__new__(RayWorkerGroup)
    group._workers = [_ActorHandle(worker)]
    group.sharding_annotations = sharding
    policy = Policy.__new__(Policy)
    policy.worker_group = group
    policy.sharding_annotations = sharding
    policy.use_dynamic_batches = False
    policy.use_sequence_packing = False
    policy.debug_payload_metrics = False  # main's __init__ default (payload-size telemetry off)
    policy.cfg = worker.cfg
    policies.append(policy)
    return policy, group._workers[0]


@pytest.fixture
def transport(worker_modules, monkeypatch):
    """Record every (name, tensor) the worker sends; deliver it to the vLLM side."""
    import nemo_rl.models.policy.utils as policy_utils

    record = types.SimpleNamespace(ipc=[], nccl=[], vllm=_VllmSide())

    def ipc(params_generator, buffer_size_bytes, zmq_socket, rank, worker_name):
        sent = [(n, t.detach().clone()) for n, t in params_generator]
        record.ipc.append({"buffer_size_bytes": buffer_size_bytes, "socket": zmq_socket})
        record.vllm.inbox.extend(sent)

    def nccl(iterator, group, src, post_iter_func, **buffers):  # main: buffer_size_bytes, ...
        sent = [(n, post_iter_func((n, t)).detach().clone()) for n, t in iterator]
        record.nccl.append({"group": group, "src": src, **buffers})
        record.vllm.inbox.extend(sent)

    monkeypatch.setattr(policy_utils, "stream_weights_via_ipc_zmq_impl", ipc)
    monkeypatch.setattr(worker_modules.upstream, "packed_broadcast_producer", nccl)
    return record


def _calibration_data():
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=g)
    return BatchedDataDict({"input_ids": ids, "input_lengths": torch.full((4,), SEQ)})


def _scale_names() -> list[str]:
    from nemo_rl.models.generation.vllm.quantization.fp8_train_utils import get_vllm_qkv_scale_names

    return [n for i in range(LAYERS) for n in get_vllm_qkv_scale_names(i).values()]


def _refit(policy, vllm, colocated: bool, kv_scales):
    from nemo_rl.algorithms.grpo import refit_policy_generation

    refit_policy_generation(policy, vllm, colocated, _refit_buffer_size_gb=0.001, kv_scales=kv_scales)


# ---- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "non_colocated"])
def test_calibrated_scales_reach_vllm(
    worker_modules, local_ray, cpu_shims, one_rank, transport, make_policy, colocated
):
    worker = _worker(worker_modules, kv_cache_dtype="fp8")
    policy, handle = make_policy(worker)
    data = _calibration_data()

    # what grpo_train does before a refit when vLLM needs KV scales
    kv_scales = policy.calibrate_qkv_fp8_scales(data, include_q=True)["layers"]
    _refit(policy, transport.vllm, colocated, kv_scales)

    assert len(worker.forward_calls) == 1
    assert torch.equal(worker.forward_calls[0][0], data["input_ids"])  # the whole DP shard
    calibrate, *refit = handle.calls
    assert calibrate[0] == "calibrate_qkv_fp8_scales" and calibrate[1]["include_q"] is True
    streamed = "stream_weights_via_ipc_zmq" if colocated else "broadcast_weights_for_collective"
    assert [c[0] for c in refit if c[0] not in GPU_ONLY_METHODS] == [streamed]
    # v0.7.0's defect: the colocated branch forwards no kv_scales to the worker (our worker
    # streams its last calibration); main forwards them on both paths (used as given)
    sent = next(kw for m, kw in refit if m == streamed)
    assert sent["kv_scales"] == per_version(v0_7_0=None if colocated else kv_scales, main=kv_scales)
    assert len(transport.ipc if colocated else transport.nccl) == 1
    if not colocated:  # main's buffer keywords reach upstream's producer through our override
        assert transport.nccl[0] == per_version(
            v0_7_0={"group": "nccl-group", "src": 0},
            main={"group": "nccl-group", "src": 0, "buffer_size_bytes": None, "num_buffers": None},
        )

    names = _scale_names()
    assert sorted(kv_scales) == sorted(names)
    assert all(0 < v < 1 for v in kv_scales.values())  # calibrated: none is the 1.0 default
    received = transport.vllm.scales()
    assert list(received) == names  # appended after the weights, in upstream's order
    for name in names:  # fp32 scalars of exactly the calibrated floats
        assert received[name] == float(torch.tensor(kv_scales[name], dtype=torch.float32)), name
    verify_kv_scales(received, kv_scales)  # none missing, none left at 1.0
    weights = [n for n, _ in transport.vllm.received if not n.endswith("_scale")]
    assert weights == [n for n, _ in worker.model.named_parameters()]
    assert cpu_shims["cuda_tensors"] == len(names)
    assert Placeholder.used == []


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "non_colocated"])
def test_refit_without_calibration_fails_naming_the_layer(
    worker_modules, local_ray, cpu_shims, one_rank, transport, make_policy, colocated
):
    worker = _worker(worker_modules, kv_cache_dtype="fp8")
    policy, _ = make_policy(worker)
    # what grpo_train does before the initial validation (val_at_start): no calibration yet
    with pytest.raises(ValueError, match=r"layer 0: .*model\.layers\.0\.self_attn\.k_scale never calibrated") as err:
        _refit(policy, transport.vllm, colocated, kv_scales=None)
    assert f"layer {LAYERS - 1}: " in str(err.value)  # every layer is named
    assert "grpo.val_at_start: false" in str(err.value)  # the actionable hint
    assert transport.vllm.inbox == [] and transport.vllm.received == []  # nothing was sent


def test_partial_calibration_fails_naming_the_missing_layer(
    worker_modules, local_ray, cpu_shims, one_rank, transport, make_policy
):
    worker = _worker(worker_modules, kv_cache_dtype="fp8")
    policy, _ = make_policy(worker)
    kv_scales = policy.calibrate_qkv_fp8_scales(_calibration_data(), include_q=True)["layers"]
    partial = {n: v for n, v in kv_scales.items() if not n.startswith("model.layers.1.")}
    with pytest.raises(ValueError, match=r"layer 1: model\.layers\.1\.self_attn\.attn\.q_scale never calibrated"):
        _refit(policy, transport.vllm, colocated=False, kv_scales=partial)
    defaults = dict(kv_scales, **{"model.layers.1.self_attn.v_scale": 1.0})
    with pytest.raises(ValueError, match=r"layer 1: model\.layers\.1\.self_attn\.v_scale left at the default 1\.0"):
        _refit(policy, transport.vllm, colocated=False, kv_scales=defaults)


def test_bf16_kv_cache_streams_no_scales_and_needs_no_calibration(
    worker_modules, local_ray, cpu_shims, one_rank, transport, make_policy
):
    worker = _worker(worker_modules, kv_cache_dtype="auto")
    policy, _ = make_policy(worker)
    _refit(policy, transport.vllm, colocated=True, kv_scales=None)
    assert transport.vllm.scales() == {}
    assert [n for n, _ in transport.vllm.received] == [n for n, _ in worker.model.named_parameters()]


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "non_colocated"])
def test_scales_the_driver_passes_win_over_the_workers_last_calibration(
    worker_modules, local_ray, cpu_shims, one_rank, transport, make_policy, colocated
):
    # whatever scales the driver's refit hands the worker reach vLLM; the worker's cache only
    # fills a refit that got none (v0.7.0's colocated path drops the driver's on the way)
    worker = _worker(worker_modules, kv_cache_dtype="fp8")
    policy, _ = make_policy(worker)
    calibrated = policy.calibrate_qkv_fp8_scales(_calibration_data(), include_q=True)["layers"]
    driver_scales = {name: 2.0 * value for name, value in calibrated.items()}
    _refit(policy, transport.vllm, colocated, driver_scales)
    sent = per_version(v0_7_0=calibrated if colocated else driver_scales, main=driver_scales)
    expected = {n: float(torch.tensor(v, dtype=torch.float32)) for n, v in sent.items()}
    assert transport.vllm.scales() == expected
    assert worker._ais_kv_scales == calibrated  # the cache is left as calibrated


# ---- calibration: upstream's function on the Q/K/V our worker saw --------------------------


class _CoreAttention(torch.nn.Module):
    """A ``core_attention`` without child modules (see the module doc)."""

    def forward(self, query, key, value, attention_mask, **kwargs):
        return query


class _ReplayWorker:
    """Stand-in ``self`` for both calibrations: ``model`` (``module.decoder.layers.N.
    self_attention.core_attention``, as under NeMo-RL's DDP wrapper) and a ``get_logprobs``
    that calls each ``core_attention`` with the recorded ``(layer, q, k, v)`` in order; no
    previous calibration (``_ais_kv_scales``, the real worker's class attribute)."""

    _ais_kv_scales = None

    def __init__(self, calls: list, num_layers: int) -> None:
        self.calls = calls
        self.model = torch.nn.Module()
        self.model.module = torch.nn.Module()
        self.model.module.decoder = torch.nn.Module()
        self.model.module.decoder.layers = torch.nn.ModuleList()
        for i in range(num_layers):
            layer = torch.nn.Module()
            layer.self_attention = torch.nn.Module()
            layer.self_attention.layer_number = i + 1
            layer.self_attention.core_attention = _CoreAttention()
            self.model.module.decoder.layers.append(layer)
        self.megatron_bridge = types.SimpleNamespace(transformer_config=types.SimpleNamespace(num_layers=num_layers))

    def _ais_device(self):
        return None

    def get_logprobs(self, *, data, micro_batch_size=None, require_router_replay=True):
        layers = self.model.module.decoder.layers
        for layer, q, k, v in self.calls:
            layers[layer].self_attention.core_attention(q, k, v, None)


def _micro_batched_forward(worker, model, micro_batch_size_default: int):
    """``get_logprobs`` of the GPT worker: one forward per micro-batch (upstream's loop)."""

    def get_logprobs(*, data, micro_batch_size=None, require_router_replay=True):
        mbs = micro_batch_size or micro_batch_size_default
        ids = data["input_ids"]
        mask = torch.ones(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool).triu(1)
        for chunk in ids.split(mbs):
            model(chunk, torch.arange(chunk.shape[1]).expand_as(chunk), mask)

    return get_logprobs


def _record_core_attention_calls(model) -> tuple[list, list]:
    calls = []

    def hook(layer):
        def record(_module, args, kwargs):
            calls.append((layer, *(t.detach().clone() for t in args[:3])))

        return record

    handles = [
        attention.core_attention.register_forward_pre_hook(hook(layer), with_kwargs=True)
        for layer, attention in find_attention_layers(model).items()
    ]
    return calls, handles


def _upstream_calibration(worker_modules, standin, data):
    impl = worker_modules.upstream.MegatronPolicyWorkerImpl
    # include_q=True: what grpo_train passes (upstream's converter needs q_scale)
    return impl.calibrate_qkv_fp8_scales(standin, data=data, include_q=True)


def _ours(worker_modules, standin, data):
    cls = worker_modules.ours.AISMegatronPolicyWorker.__ray_actor_class__
    return cls.calibrate_qkv_fp8_scales(standin, data=data, include_q=True)


def test_our_calibration_equals_upstreams_on_the_gpt_activations(worker_modules, cpu_shims, one_rank, monkeypatch):
    monkeypatch.delenv(KV_REDUCTION_ENV, raising=False)
    worker = _worker(worker_modules, kv_cache_dtype="fp8")
    worker.get_logprobs = _micro_batched_forward(worker, worker.model, micro_batch_size_default=1)
    data = _calibration_data()  # 4 sequences: 4 micro-batches of 1
    calls, handles = _record_core_attention_calls(worker.model)
    try:
        ours = worker.calibrate_qkv_fp8_scales(data=data, include_q=True)
    finally:
        for handle in handles:
            handle.remove()
    assert len(calls) == 4 * LAYERS  # every micro-batch of every layer, in call order
    upstream = _upstream_calibration(worker_modules, _ReplayWorker(calls, LAYERS), data)
    assert upstream["layers"] == ours["layers"]  # bit-identical floats, same names and order
    assert upstream["percentile"] == ours["percentile"] and upstream["margin"] == ours["margin"]
    assert cpu_shims["cuda_tensors"] > 0  # upstream's _percentile ran (on the CPU)


def _heavy_tailed_calls(num_micro_batches: int) -> list:
    """Synthetic Q/K/V: Student-t entries plus an attention-sink token per micro-batch."""
    g = torch.Generator().manual_seed(11)
    t = torch.distributions.StudentT(torch.tensor(3.0))
    calls = []
    for _ in range(num_micro_batches):
        for layer in range(LAYERS):
            q, k, v = (t.sample((4, 1, 2, 8)) * (1 + layer) for _ in range(3))
            k[0, 0, 0, 0] = 40.0 * (1 + torch.rand((), generator=g))  # the sink
            calls.append((layer, q, k, v))
    return calls


@pytest.mark.parametrize("num_micro_batches", [3, 600])
def test_our_calibration_equals_upstreams_on_heavy_tailed_qkv(
    worker_modules, cpu_shims, one_rank, monkeypatch, num_micro_batches
):
    # 3 micro-batches: upstream's percentile is the max; 600: the nearest rank below it
    torch.manual_seed(5)
    standin = _ReplayWorker(_heavy_tailed_calls(num_micro_batches), LAYERS)
    data = {"input_ids": torch.zeros(num_micro_batches, 1)}
    monkeypatch.delenv(KV_REDUCTION_ENV, raising=False)
    upstream = _upstream_calibration(worker_modules, standin, data)
    ours = _ours(worker_modules, standin, data)
    assert upstream["layers"] == ours["layers"]
    # the element percentile (an explicit option) clips the sink: with 3 micro-batches
    # upstream's amax is the max of every element, the element rule's P99.9 of 64 elements
    # lies below each micro-batch's sink
    monkeypatch.setenv(KV_REDUCTION_ENV, "element_percentile")
    element = _ours(worker_modules, standin, data)["layers"]
    assert element != ours["layers"]
    if num_micro_batches == 3:
        for name, value in ours["layers"].items():
            assert element[name] <= value, name
            assert element[name] < value or not name.endswith("k_scale"), name
    monkeypatch.setenv(KV_REDUCTION_ENV, "p99")
    with pytest.raises(ValueError, match=r"NEMO_AIS_KV_REDUCTION='p99' is invalid"):
        _ours(worker_modules, standin, data)


def test_upstreams_substring_match_also_hooks_core_attentions_children(worker_modules, cpu_shims, one_rank):
    # why the comparison replays the Q/K/V through a stand-in (module doc): on megatron-core's
    # local spec upstream's pre-hook also fires on core_attention.scale_mask_softmax
    # (scores, mask), taking the boolean mask for k, and on .attention_dropout
    worker = _worker(worker_modules, kv_cache_dtype="fp8")
    children = [n for n, _ in worker.model.named_modules() if ".core_attention." in n]
    assert children and all("self_attention.core_attention" in n for n in children)
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        _upstream_calibration(worker_modules, worker, _calibration_data())
