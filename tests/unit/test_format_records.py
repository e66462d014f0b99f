# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The format records: the table matches the configs, and FP8's short reference is the
fast path bit for bit (DeepGEMM's per_block_cast_to_fp8 against quantize_blockwise)."""

from __future__ import annotations

import pytest
import torch

from nemo_ais.formats.fp8_block import quantize_blockwise, quantize_blockwise_reference
from nemo_ais.formats.registry import FORMATS, REFIT_FORMATS, get_format
from nemo_ais.refit.stream import RefitConfig
from nemo_ais.rollout.config import ROLLOUT_FORMATS
from nemo_ais.rules.format_geometry import GEOMETRY


def test_the_table_names_every_format_the_configs_accept():
    assert set(REFIT_FORMATS) == set(RefitConfig.model_fields["format"].annotation.__args__)
    assert set(ROLLOUT_FORMATS) <= set(FORMATS)
    assert {name: f.name for name, f in FORMATS.items()} == {n: n for n in FORMATS}
    with pytest.raises(ValueError, match=r"format='fp4' is invalid: expected one of"):
        get_format("fp4")


def test_records_answer_what_the_consumers_ask():
    fp8, mxfp8, w4a4 = get_format("fp8"), get_format("mxfp8"), get_format("nvfp4_w4a4")
    assert (fp8.block, fp8.k_multiple, fp8.pads) == ((128, 128), 1, True)
    assert (mxfp8.block, mxfp8.k_multiple, mxfp8.shared_global_scale) == ((1, 32), 32, False)
    assert (w4a4.block, w4a4.shared_global_scale, w4a4.static_input_amax) == ((1, 16), True, True)
    # bytes sent for a [256, 256] weight: codes + scales (+ NVFP4's fp32 scalars)
    cfg = RefitConfig()
    assert fp8.refit_bytes(65536, (256, 256), cfg) == 65536 + 4 * 4
    assert mxfp8.refit_bytes(65536, (256, 256), cfg) == 65536 + 2048
    assert w4a4.refit_bytes(65536, (256, 256), cfg) == 32768 + 4096 + 2 * 4
    assert get_format("mxfp4").refit_pairs is None and get_format("bf16").quantize is None


@pytest.mark.parametrize("shape", [(256, 256), (200, 300), (1, 5), (129, 128), (0, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_reference_is_the_fast_path_bit_for_bit(shape, dtype):
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(shape, generator=gen) * torch.rand(shape, generator=gen) * 3).to(dtype)
    if x.numel():
        x[0, : min(3, shape[1])] = 0.0  # a partly zero tile
    q_ref, s_ref = quantize_blockwise_reference(x)
    q, s = quantize_blockwise(x)
    assert q.shape == q_ref.shape and s.shape == s_ref.shape
    diff = (q.view(torch.uint8) != q_ref.view(torch.uint8)).nonzero()
    assert diff.numel() == 0, (
        f"first code mismatch at {diff[0].tolist()}: "
        f"{q[tuple(diff[0])].item()} vs reference {q_ref[tuple(diff[0])].item()}"
    )
    assert torch.equal(s, s_ref)


@pytest.mark.parametrize("name", sorted(REFIT_FORMATS))
def test_the_torch_free_geometry_is_what_the_refit_sends(name):
    # the offline check never imports torch: it reads rules.format_geometry, as the records do
    from nemo_ais.preflight.checks.formats import WEIGHT_BYTES

    shape = (4096, 4096)
    numel = shape[0] * shape[1]
    sent = get_format(name).refit_bytes(numel, shape, RefitConfig(format=name))
    # the table leaves out NVFP4's per-tensor fp32 scales (global, W4A4's input_scale)
    assert 0 <= sent - WEIGHT_BYTES[name] * numel <= 8
    assert WEIGHT_BYTES[name] == GEOMETRY[name].weight_bytes


def test_every_format_record_has_its_geometry():
    assert set(GEOMETRY) == set(FORMATS)
    for name, geometry in GEOMETRY.items():
        assert get_format(name).block == geometry.block, name
        # the torch-free copy the offline check reads is the record's own fact
        assert get_format(name).static_input_amax == geometry.static_input_amax, name
