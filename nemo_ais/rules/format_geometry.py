# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Each rollout format's weight block and bytes per weight, torch-free.

:data:`GEOMETRY` is the one table the format records (:mod:`nemo_ais.formats`) and the offline check read.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

FP8_BLOCK = 128
"""Block FP8 (DeepSeek-style, vLLM / DeepGEMM): one fp32 scale per 128 x 128 weight tile."""
MX_BLOCK = 32
"""MXFP8 / MXFP4 (OCP MX): one UE8M0 scale per 32 consecutive elements."""
NVFP4_BLOCK = 16
"""NVFP4: one E4M3 scale per 16 consecutive elements."""

Fp8Family = Literal["reciprocal", "divide", "multiplier"]
"""Block FP8's scale formula families (:data:`nemo_ais.formats.fp8_block.FAMILY_FORMULAS` says what each does)."""
RENAMED_FAMILIES = {"a": "reciprocal", "b": "divide", "c": "multiplier"}
"""The former one-letter names, refused with the new one."""
TE_FAMILY, TE_BLOCK = "multiplier", (FP8_BLOCK, FP8_BLOCK)
"""The one family and tile Transformer Engine's block-FP8 quantizer implements."""


def refuse_renamed_family(family: Any) -> Any:
    """``family`` unchanged, or ``ValueError`` for a former one-letter name, naming its new name."""
    if isinstance(family, str) and family in RENAMED_FAMILIES:
        raise ValueError(
            f"family={family!r} was renamed {RENAMED_FAMILIES[family]!r}: the families are "
            f"named after what they do, expected one of {Fp8Family.__args__}"
        )
    return family


def te_refuses(family: str, block: tuple[int, int]) -> str | None:
    """Why ``backend='te'`` cannot quantize ``family`` / ``block``, or None if it can."""
    if family == TE_FAMILY and tuple(block) == TE_BLOCK:
        return None
    return (
        f"backend='te' implements family={TE_FAMILY!r} with block={TE_BLOCK} only, got "
        f"family={family!r} block={tuple(block)}"
    )


class Geometry(NamedTuple):
    """A format's weight block (rows, cols that share one scale), what vLLM holds per weight, its input amax."""

    block: tuple[int, int]
    value_bits: int  # bits of one element
    scale_bytes: int  # bytes of one block scale (NVFP4's per-tensor fp32 scales are left out)
    static_input_amax: bool = False  # the activation quantizer needs a calibrated input amax (the refit's file)

    @property
    def weight_bytes(self) -> float:
        """Bytes per weight of a quantized linear: its value and its share of the block scale."""
        return self.value_bits / 8 + self.scale_bytes / (self.block[0] * self.block[1])


GEOMETRY: dict[str, Geometry] = {
    "bf16": Geometry((1, 1), 16, 0),
    "fp8": Geometry((FP8_BLOCK, FP8_BLOCK), 8, 4),
    "mxfp8": Geometry((1, MX_BLOCK), 8, 1),
    "nvfp4_w4a16": Geometry((1, NVFP4_BLOCK), 4, 1),
    "nvfp4_w4a4": Geometry((1, NVFP4_BLOCK), 4, 1, static_input_amax=True),
    "mxfp4": Geometry((1, MX_BLOCK), 4, 1),
}
"""Every format of :data:`nemo_ais.formats.registry.FORMATS`, by the same name (tested)."""


def fp8_refit_block_problem(block: object) -> str | None:
    """``ais_fp8_refit.block`` (as given) against NeMo-RL's FP8 engine (``weight_block_size`` 128 x 128)."""
    engine = GEOMETRY["fp8"].block
    if isinstance(block, list | tuple) and tuple(block) == engine:
        return None
    shown = list(block) if isinstance(block, list | tuple) else repr(block)
    return (
        f"ais_fp8_refit.block={shown} is invalid: expected {list(engine)}, the weight_block_size of NeMo-RL's FP8 "
        "engine (its weight_scale_inv is [N/128, K/128])"
    )


def fp8_refit_precision_problem(precision: object) -> str | None:
    """An enabled ``ais_fp8_refit`` against ``policy.generation.vllm_cfg.precision`` (it replaces the FP8 engine's)."""
    if precision == "fp8":
        return None
    return (
        f"ais_fp8_refit.enabled=True needs policy.generation.vllm_cfg.precision: fp8 (got {precision!r}): it "
        "replaces the FP8 engine's weight refit"
    )
