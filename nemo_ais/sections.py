# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The machinery of every config section: the strict base model and its errors at a boundary.

A leaf module (pydantic and the standard library only). :func:`validate_section` turns pydantic's error into a
``ValueError`` naming the field path, value, allowed range and a hint; :func:`require_config` refuses a plain dict
passed for a config object with a ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

FLOAT32_MAX = 3.4028234663852886e38
"""``torch.finfo(torch.float32).max``: the bound of a loss constant (the loss computes in float32 or wider)."""


class Section(BaseModel):
    """A strict, frozen config section; ``moved_keys`` (old key -> new dotted key) are refused.

    strict: no silent coercion (True is not 1.0, "2" is not 2.0; ints are still floats);
    allow_inf_nan=False: a non-finite constant never reaches the mixer.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False)
    moved_keys: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_keys(cls, data: Any) -> Any:
        errors = moved_key_errors(cls, data, "")
        if errors:
            raise ValueError("; ".join(errors))
        return data


def moved_key_errors(model: type[BaseModel], data: Any, path: str) -> list[str]:
    """``<path>.<old> moved: use <path>.<new>`` for each moved key present in ``data``."""
    moved = getattr(model, "moved_keys", {})
    if not isinstance(data, Mapping) or not moved:
        return []
    prefix = f"{path}." if path else ""
    return [f"{prefix}{old} moved: use {prefix}{new}" for old, new in moved.items() if old in data]


def plain_mapping(data: Any) -> Any:
    """``data`` with every nested mapping (e.g. an OmegaConf ``DictConfig``) as a plain dict."""
    return {k: plain_mapping(v) for k, v in data.items()} if isinstance(data, Mapping) else data


_M = TypeVar("_M", bound=BaseModel)


def validate_section(model: type[_M], data: Any, path: str) -> _M:
    """Validate ``data`` (a mapping, None or an instance) as ``model``.

    On failure one ``ValueError``, a line per problem: ``<path>.field=value is invalid: reason (hint)``, ``path`` being
    the section's dotted prefix (e.g. ``loss_fn.ais.weight_cap=0.8 is invalid: expected > 1.0 (C caps rho; ...)``).
    """
    if isinstance(data, model):
        return data
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise TypeError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    data = plain_mapping(data)  # e.g. an OmegaConf DictConfig with nested sub-sections
    moved = moved_key_errors(model, data, path)
    if moved:
        raise ValueError("\n".join(moved))
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ValueError(_format_errors(model, err, path)) from None


def _field_info(model: type[BaseModel], loc: tuple) -> tuple[type[BaseModel], Any]:
    """The (sub-)model that owns the last key of ``loc``, and that key's FieldInfo (or None)."""
    info = None
    for key in loc:
        info = model.model_fields.get(str(key)) if isinstance(model, type) else None
        sub = getattr(info, "annotation", None)
        if key is not loc[-1] and isinstance(sub, type) and issubclass(sub, BaseModel):
            model = sub
    return model, info


def _format_errors(model: type[BaseModel], err: ValidationError, path: str) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"])
        where = f"{path}.{field}" if field else path
        owner, info = _field_info(model, tuple(e["loc"]))
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(owner.model_fields))
            lines.append(f"{where} is not a known field (allowed: {allowed})")
            continue
        value = e.get("input")
        hint = f" ({info.description})" if info is not None and info.description else ""
        reason = e["msg"].removeprefix("Value error, ").replace("Input should be ", "expected ")
        if e.get("ctx", {}).get("le") == FLOAT32_MAX:  # pydantic writes it as 39 digits
            reason = "expected a float32 value, at most 3.4028235e+38"
        if field and not (e["type"] == "value_error" and isinstance(value, Mapping)):
            lines.append(f"{where}={value!r} is invalid: {reason}{hint}")
        else:  # cross-field rule of a (sub-)section: the message starts with the field's name
            lines.append(f"{where}.{reason}")
    return "\n".join(lines)


def config_type_error(
    value: object, expected: type[BaseModel], where: str, *, optional: bool = False
) -> TypeError | None:
    """The ``TypeError`` :func:`require_config` raises for ``value`` (None if fine), for callers that raise later."""
    if isinstance(value, expected) or (optional and value is None):
        return None
    name = expected.__name__
    got = type(value).__name__
    accepted = f"{expected.__module__}.{name}" + (" or None" if optional else "")
    hint = ""
    if isinstance(value, Mapping):
        hint = f"; build one with {name}(**d) or {name}.model_validate(d)"
    elif isinstance(value, BaseModel):
        hint = f" ({got} is a different section)"
    return TypeError(f"{where}: got {got}, expected {accepted}{hint}")


def require_config(value: object, expected: type[BaseModel], where: str, *, optional: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is an ``expected`` instance (or None if ``optional``).

    E.g. ``compute_statistics(config): got dict, expected nemo_ais.config.CorrectionConfig;
    build one with CorrectionConfig(**d) or CorrectionConfig.model_validate(d)``.
    """
    error = config_type_error(value, expected, where, optional=optional)
    if error is not None:
        raise error
