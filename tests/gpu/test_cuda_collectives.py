# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The cluster path's device-side collectives, on a real CUDA device over NCCL.

In a NeMo-RL worker the AIS statistics and the FP8 KV-scale table are reduced over an
NCCL group, so they must be moved to the worker's CUDA device first (``device=`` of
:func:`~nemo_ais.nemo_rl.seam.prepare_global_batches` and
:meth:`~nemo_ais.refit.kv_scales.KVScaleCalibrator.compute_scales`); a CPU tensor in an
NCCL collective is an error. The CPU suite covers the same code over gloo. Here a
one-rank NCCL group (one GPU) checks the device placement and that the results equal the
single-process CPU float64 ones. Skips without CUDA.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from nemo_ais.config import CorrectionConfig
from nemo_ais.nemo_rl.seam import prepare_global_batches
from nemo_ais.refit.kv_scales import KVScaleCalibrator, KVScaleConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def nccl_group(tmp_path_factory):
    if dist.is_initialized():  # pragma: no cover - another module owns the default group
        yield dist.new_group(backend="nccl")
        return
    rendezvous = tmp_path_factory.mktemp("nccl") / "rendezvous"  # a file: no port to race for
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"file://{rendezvous}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
        device_id=torch.device("cuda", 0),
    )
    yield dist.group.WORLD
    dist.destroy_process_group()


class _Sink:
    def __init__(self):
        self.diagnostics = None

    def attach_diagnostics(self, diagnostics):
        self.diagnostics = list(diagnostics)


def _batch(b: int, s: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    gen = -torch.rand(b, s, generator=g, dtype=torch.float64) * 3
    prev = gen + 0.05 * torch.randn(b, s, generator=g, dtype=torch.float64)
    token_mask = (torch.rand(b, s, generator=g) < 0.8).to(torch.int64)
    return {
        "input_ids": torch.zeros(b, s, dtype=torch.int64),
        "advantages": torch.randn(b, s, generator=g).to(dtype),
        "prev_logprobs": prev.to(dtype),
        "generation_logprobs": gen.to(dtype),
        "token_mask": token_mask,
        "sample_mask": torch.ones(b, dtype=torch.int64),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ais_statistics_reduce_over_nccl_on_the_cuda_device(nccl_group, dtype):
    config = CorrectionConfig(mode="ais", severity_scale=0.01)
    cpu = _batch(16, 96, dtype, seed=3)
    cuda = {k: v.cuda() for k, v in cpu.items()}
    sink_gpu, sink_cpu = _Sink(), _Sink()
    got = prepare_global_batches(cuda, sink_gpu, config, local_batch_size=8, group=nccl_group, device="cuda")
    ref = prepare_global_batches(cpu, sink_cpu, config, local_batch_size=8, group=None)
    assert len(got) == len(ref) == 2
    assert cuda["ais_global_batch"].device.type == "cuda"
    for g_diag, r_diag in zip(got, ref, strict=True):
        g, r = g_diag.as_dict(), r_diag.as_dict()
        assert 0.0 < r["alpha"] <= 1.0
        for key in r:  # same float64 statistics, reduced on another device
            assert g[key] == pytest.approx(r[key], rel=1e-12, abs=1e-15), key


def test_kv_scale_table_reduces_over_nccl_on_the_cuda_device(nccl_group):
    config = KVScaleConfig(percentile=99.9, margin=1.05, include_q=True)
    on_gpu, on_cpu = KVScaleCalibrator(3, config), KVScaleCalibrator(3, config)
    g = torch.Generator().manual_seed(7)
    for layer in range(3):
        for kind in ("q", "k", "v"):
            x = torch.randn(4, 33, 128, generator=g) * (layer + 1)
            on_gpu.observe(layer, kind, x.cuda().to(torch.bfloat16))
            on_cpu.observe(layer, kind, x.to(torch.bfloat16))
    got = on_gpu.compute_scales(group=nccl_group, device="cuda")
    ref = on_cpu.compute_scales(group=None)
    assert got.scale.device.type == "cpu"  # the result always comes back to the host
    assert torch.equal(got.amax, ref.amax)
    assert got.to_vllm() == ref.to_vllm()
    assert all(v > 0 and v != 1.0 for v in got.to_vllm().values())
