# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mismatch attributed by source: which layers and modules of a rollout format carry it.

Sources: per decoder layer and module its weights and (``fp8``, ``mxfp8``, ``nvfp4_w4a4``)
its input activations, and per layer the KV cache. :func:`attribute_mismatch`:

1. Build and calibrate the twin on the prompts; sample responses unless given.
2. Score the responses teacher-forced with a subset ``Q`` of the sources quantized (a
   module with neither source in ``Q`` runs its original ``nn.Linear``).
3. ``M(Q)``: :func:`~nemo_ais.rollout.sampling.logprob_mismatch` against the unquantized model on the same tokens.
4. Per source or group ``s``: ``alone = M({s})`` and ``buys = M(all) - M(all without s)``,
   ranked by ``alone`` (mismatches do not add up).

``M({})`` is exactly 0 and ``M(all)`` the twin's own score (tested).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.fake_quant import LINEAR_FAKE_QUANT
from nemo_ais.rollout.kv_cache import QuantizedKVCache
from nemo_ais.rollout.linear import Fp8Linear, QuantExperts, QuantLinear
from nemo_ais.rollout.sampling import MismatchStats, logprob_mismatch, score_responses
from nemo_ais.rollout.twin import RolloutTwin

SourceKind = Literal["weights", "activations", "kv_cache"]
_LAYER_PREFIX = re.compile(r"^(?:.*\.)?layers\.(\d+)\.(.+)$")


class Source(NamedTuple):
    """One quantized source: ``kind`` of module ``module`` (relative name) in ``layer``."""

    kind: SourceKind
    layer: int
    module: str

    @property
    def label(self) -> str:
        """``"layer 1 mlp.down_proj weights"`` (``"layer 1 KV cache"``)."""
        if self.kind == "kv_cache":
            return f"layer {self.layer} KV cache"
        return f"layer {self.layer} {self.module} {self.kind}"


class AttributionRow(NamedTuple):
    """One source or ``group`` (source, kind, layer, module): ``alone``, ``kept``, ``buys``."""

    label: str
    group: str
    sources: tuple[Source, ...]
    alone: MismatchStats
    kept: MismatchStats
    buys: float


class Attribution(NamedTuple):
    """Result of :func:`attribute_mismatch`: ``full`` = M(all), ``none`` = M({}), ranked rows."""

    config: RolloutPrecisionConfig
    full: MismatchStats
    none: MismatchStats
    rows: tuple[AttributionRow, ...]
    groups: tuple[AttributionRow, ...]
    what: str = ""


class _Switchable(nn.Module):
    """A twin linear whose weight and input quantization are switched per source (step 2)."""

    def __init__(self, quant: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.quant = quant
        self.register_buffer("weight_hp", weight.detach().clone(), persistent=False)
        self.bias_hp = None if bias is None else bias.detach().clone()
        self.weights_on = True
        self.activations_on = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The twin module's forward when both are on; high precision where off."""
        if self.weights_on and self.activations_on:
            return self.quant(x)
        if not (self.weights_on or self.activations_on):
            return F.linear(x, self.weight_hp.to(x.dtype), self.bias_hp)
        x_in = self.quant.quantize_input(x) if self.activations_on else x
        w = self.quant.weight_dequant if self.weights_on else self.weight_hp
        y = F.linear(x_in.to(torch.float32), w.to(torch.float32))
        if self.bias_hp is not None:
            y = y + self.bias_hp.to(torch.float32)
        return y.to(x.dtype)


class _SwitchableModule(nn.Module):
    """A replaced twin module: the original one runs while none of its sources is on."""

    def __init__(self, quant: nn.Module, original: nn.Module, leaves: Sequence[_Switchable]):
        super().__init__()
        self.quant = quant
        self.original = original
        self.leaves = list(leaves)

    def forward(self, *args, **kwargs):
        """The original module if every leaf is off, else the twin's (leaves switched)."""
        if any(leaf.weights_on or leaf.activations_on for leaf in self.leaves):
            return self.quant(*args, **kwargs)
        return self.original(*args, **kwargs)


class _LayerKVCache(QuantizedKVCache):
    """The twin's quantized KV cache on the layers in ``layers`` only (step 2)."""

    def __init__(self, kind, scales, layers: frozenset[int], error_scale: float) -> None:
        super().__init__(kind, scales, error_scale=error_scale)  # the twin's dial k, as its own cache
        self.quantized_layers = layers

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Quantized write on the selected layers, a plain ``DynamicCache`` write elsewhere."""
        if layer_idx in self.quantized_layers:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        return DynamicCache.update(self, key_states, value_states, layer_idx, *args, **kwargs)


class _SourceSwitch:
    """Installs :class:`_Switchable` wrappers in a calibrated twin; :meth:`set` picks ``Q``."""

    def __init__(self, twin: RolloutTwin, original: nn.Module) -> None:
        self.twin = twin
        self.leaves: dict[tuple[int, str], list[_Switchable]] = {}
        dtype = twin.config.torch_compute_dtype
        for name in twin.quantized_module_names:
            match = _LAYER_PREFIX.match(name)
            assert match is not None, name  # the twin quantizes decoder layers only
            layer, rel = int(match.group(1)), match.group(2)
            orig = copy.deepcopy(original.get_submodule(name))
            if dtype is not None:
                orig.to(dtype)
            quant = twin.model.get_submodule(name)
            if isinstance(quant, QuantExperts):
                leaves = self._wrap_experts(quant, orig, layer, rel)
                twin.model.set_submodule(name, _SwitchableModule(quant, orig, leaves))
            else:
                assert isinstance(quant, QuantLinear | Fp8Linear), type(quant)
                leaf = _Switchable(quant, orig.weight, orig.bias)
                self.leaves.setdefault((layer, rel), []).append(leaf)
                twin.model.set_submodule(name, _SwitchableModule(leaf, orig, [leaf]))
        # formats whose activations stay in high precision (W4A16) have no activation source
        self.activations = twin.fake_quant.activation is not LINEAR_FAKE_QUANT["bf16"].activation
        self.kv_layers = range(twin.num_layers) if twin.kv_cache_quantized else range(0)

    def _wrap_experts(self, experts: QuantExperts, orig: nn.Module, layer: int, rel: str) -> list[_Switchable]:
        out = []
        for proj in ("gate_up_proj", "down_proj"):
            linears = getattr(experts, proj)
            weights = getattr(orig, proj).detach()
            for e, linear in enumerate(linears):
                leaf = _Switchable(linear, weights[e], None)
                linears[e] = leaf
                self.leaves.setdefault((layer, f"{rel}.{proj}"), []).append(leaf)
                out.append(leaf)
        return out

    def sources(self) -> list[Source]:
        """Every source, in model order: weights, activations per module; KV per layer."""
        out: list[Source] = []
        for layer, rel in self.leaves:
            out.append(Source("weights", layer, rel))
            if self.activations:
                out.append(Source("activations", layer, rel))
        out += [Source("kv_cache", layer, "kv_cache") for layer in self.kv_layers]
        return sorted(out, key=lambda s: (s.layer, s.kind == "kv_cache"))

    def set(self, quantized: Iterable[Source]) -> DynamicCache | None:
        """Quantize exactly ``quantized``; return the KV cache to score with (None: none)."""
        on = set(quantized)
        for (layer, rel), leaves in self.leaves.items():
            for leaf in leaves:
                leaf.weights_on = Source("weights", layer, rel) in on
                leaf.activations_on = Source("activations", layer, rel) in on if self.activations else leaf.weights_on
        kv = frozenset(s.layer for s in on if s.kind == "kv_cache")
        if not kv:
            return None
        assert self.twin.kv_scales is not None
        return _LayerKVCache(self.twin.config.kv_cache, self.twin.kv_scales, kv, self.twin.config.error_scale)


def _groups(sources: Sequence[Source]) -> list[tuple[str, str, tuple[Source, ...]]]:
    """``(label, group kind, sources)`` per source kind, layer and module across layers."""
    out = []
    for kind in ("weights", "activations", "kv_cache"):
        members = tuple(s for s in sources if s.kind == kind)
        if members:
            out.append(("KV cache (all layers)" if kind == "kv_cache" else f"all {kind}", "kind", members))
    for layer in sorted({s.layer for s in sources}):
        out.append((f"layer {layer} (all)", "layer", tuple(s for s in sources if s.layer == layer)))
    for module in dict.fromkeys(s.module for s in sources if s.kind != "kv_cache"):
        out.append((f"{module} (all layers)", "module", tuple(s for s in sources if s.module == module)))
    return out


@torch.no_grad()
def attribute_mismatch(
    model: nn.Module,
    config: RolloutPrecisionConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    response_ids: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    max_new_tokens: int = 32,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    temperature: float = 1.0,
    what: str = "",
) -> Attribution:
    """Attribute the twin's mismatch on ``model`` to its quantized sources (module doc).

    Args:
        model: a HF causal LM in eval mode (the BF16 reference; not modified).
        config: the rollout precision to attribute.
        input_ids, attention_mask: ``[B, P]`` left-padded prompts.
        response_ids, response_mask: responses to score; None samples them with the twin.
        what: a description of model and batch, kept in the result.

    Raises:
        ValueError: as :class:`~nemo_ais.rollout.twin.RolloutTwin`, or a response mask missing.
    """
    twin = RolloutTwin(model, config)  # 1. build, then calibrate on the prompts
    if response_ids is None:
        out = twin.generate(
            input_ids,
            attention_mask,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generator=generator,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
        )
        response_ids, response_mask = out.response_ids, out.response_mask
    elif response_mask is None:
        raise ValueError("response_mask: got None with response_ids, expected [B, T] 0/1")
    else:
        twin.score(input_ids, attention_mask, response_ids, temperature=temperature)
    switch = _SourceSwitch(twin, model)  # 2. switch.set(Q) quantizes exactly Q
    sources = switch.sources()
    reference = score_responses(model, input_ids, attention_mask, response_ids, temperature=temperature)

    def mismatch(quantized: Iterable[Source]) -> MismatchStats:  # 2. + 3.
        cache = switch.set(quantized)
        logp = score_responses(
            twin.model, input_ids, attention_mask, response_ids, temperature=temperature, past_key_values=cache
        )
        return logprob_mismatch(reference, logp, response_mask)

    full, none = mismatch(sources), mismatch(())
    everything = set(sources)

    def row(label: str, group: str, members: tuple[Source, ...]) -> AttributionRow:  # 4.
        kept = mismatch(everything - set(members))
        buys = full.mean_abs_delta - kept.mean_abs_delta
        return AttributionRow(label, group, members, mismatch(members), kept, buys)

    def ranked(rows: list[AttributionRow]) -> tuple[AttributionRow, ...]:
        return tuple(sorted(rows, key=lambda r: -r.alone.mean_abs_delta))

    rows = ranked([row(s.label, "source", (s,)) for s in sources])
    groups = [row(label, group, members) for label, group, members in _groups(sources)]
    by_group = tuple(r for k in ("kind", "layer", "module") for r in ranked([g for g in groups if g.group == k]))
    return Attribution(config, full, none, rows, by_group, what)


def _describe(config: RolloutPrecisionConfig) -> str:
    kept = []
    if config.num_first_layers_in_bf16:
        kept.append(f"first {config.num_first_layers_in_bf16} layers")
    if config.num_last_layers_in_bf16:
        kept.append(f"last {config.num_last_layers_in_bf16} layers")
    if config.attention_in_bf16:
        kept.append("attention")
    if config.keep_patterns:
        kept.append(f"keep_patterns {list(config.keep_patterns)}")
    extra = f", kept in BF16: {', '.join(kept)}" if kept else ""
    dial = f", error scale k={config.error_scale:g}" if config.error_scale != 1.0 else ""
    return f"format {config.format}, KV cache {config.kv_cache}{dial}{extra}"


def attribution_markdown(att: Attribution, top: int | None = None) -> str:
    """Two markdown tables (groups, then the ``top`` sources; None: all) with a caption."""
    f = att.full
    head = (
        f"Rollout precision: {_describe(att.config)}. {att.what + '. ' if att.what else ''}All sources quantized: mean "
        f"|dlogp| {f.mean_abs_delta:.4f}, gen_kl_error (k3) {f.gen_kl_error:.5f}, token_mult_prob_error "
        f"{f.token_mult_prob_error:.4f} over {f.n_tok} tokens; nothing quantized: {att.none.mean_abs_delta:.4f}. "
        "*alone*: only that source quantized; *kept in BF16*: every other source quantized; *buys*: all-quantized mean "
        "|dlogp| minus kept-in-BF16's (share of the all-quantized value). Teacher-forced log-probs against the "
        "unquantized model's on the same tokens."
    )
    cols = (
        "| {name} | alone: mean abs dlogp | alone: gen_kl_error | alone: token_mult_prob_error "
        "| kept in BF16: mean abs dlogp | buys |\n|---|---|---|---|---|---|"
    )

    def line(r: AttributionRow) -> str:
        share = r.buys / f.mean_abs_delta if f.mean_abs_delta > 0 else 0.0
        return (
            f"| {r.label} | {r.alone.mean_abs_delta:.4f} | {r.alone.gen_kl_error:.5f} | "
            f"{r.alone.token_mult_prob_error:.4f} | {r.kept.mean_abs_delta:.4f} | {r.buys:+.4f} ({share:+.0%}) |"
        )

    rows = att.rows if top is None else att.rows[:top]
    shown = f"top {len(rows)} of {len(att.rows)}" if len(rows) < len(att.rows) else "all"
    parts = [
        head,
        "By kind, layer and module (each group ranked by *alone*):",
        cols.format(name="group") + "\n" + "\n".join(line(r) for r in att.groups),
        f"By source ({shown}, ranked by *alone*):",
        cols.format(name="source") + "\n" + "\n".join(line(r) for r in rows),
    ]
    return "\n\n".join(parts) + "\n"


def plot_attribution(att: Attribution, path: str | Path, top: int = 16) -> Path:
    """Horizontal bars of *alone* and *buys* (mean |dlogp|) per group and top source; PNG."""
    from nemo_ais.plotting import pyplot, save_figures

    panels = [("by kind, layer and module", att.groups), (f"top {top} sources", att.rows[:top])]
    heights = [max(2.0, 0.28 * len(rows) + 1.0) for _, rows in panels]
    fig, axes = pyplot().subplots(2, 1, figsize=(8.0, sum(heights)), gridspec_kw={"height_ratios": heights})
    for ax, (title, rows) in zip(axes, panels, strict=True):
        y = list(range(len(rows)))[::-1]
        for dy, values, label, color in (
            (0.2, [r.alone.mean_abs_delta for r in rows], "alone (only this quantized)", "tab:red"),
            (-0.2, [r.buys for r in rows], "buys (kept in BF16)", "tab:blue"),
        ):
            ax.barh([v + dy for v in y], values, 0.4, label=label, color=color)
        ax.axvline(att.full.mean_abs_delta, color="black", ls="--", lw=1, label="all quantized")
        ax.set_yticks(y, [r.label for r in rows], fontsize=8)
        ax.set_xlabel("mean |Δ log p| vs the unquantized model (nats/token)")
        ax.set_title(f"{_describe(att.config)}: {title}", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figures({path.name: fig}, path.parent, dpi=120)[0]


def attribution_records(att: Attribution) -> list[dict]:
    """Every row and group as a JSON-ready dict (``label``, ``group``, ``alone``, ``kept``, ``buys``)."""
    rows = [
        ("all quantized", "all", att.full, att.none, att.full.mean_abs_delta),
        *((r.label, r.group, r.alone, r.kept, r.buys) for r in (*att.groups, *att.rows)),
    ]
    return [
        {"label": label, "group": group, "alone": a._asdict(), "kept": k._asdict(), "buys": b}
        for label, group, a, k, b in rows
    ]


def _strict_json(value: Any) -> Any:
    """``value`` with every non-finite float as None: strict JSON (``inf`` is no JSON number)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict_json(v) for v in value]
    return value


def write_attribution(att: Attribution, out_dir: str | Path, *, top: int = 16, plot: bool = True) -> list[Path]:
    """Write ``attribution.md`` (all sources), ``attribution.json`` (a non-finite value as null) and the PNG."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {"config": att.config.model_dump(mode="json"), "what": att.what}
    texts = {
        out / "attribution.md": "# Mismatch attribution\n\n" + attribution_markdown(att),
        out / "attribution.json": json.dumps(
            {**record, "rows": _strict_json(attribution_records(att))}, indent=1, allow_nan=False
        )
        + "\n",
    }
    partials = {path: path.with_name(path.name + ".partial") for path in texts}
    try:  # every file complete beside its path first: an interrupted run leaves the old set, not a mix
        for path, text in texts.items():
            try:
                partials[path].write_text(text)
            except OSError as err:
                raise OSError(err.errno, err.strerror, str(path)) from err
        png = out / "attribution.png"
        written = [plot_attribution(att, png, top=top)] if plot else []
        if not plot:
            png.unlink(missing_ok=True)  # an earlier run's plot is not this one's
        for path, partial in partials.items():
            os.replace(partial, path)
    finally:
        for partial in partials.values():
            partial.unlink(missing_ok=True)
    return [*texts, *written]
