# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""NeMo-RL main's split train-step API is refused for the AIS loss, with the reason.

The worker class is our real ``AISMegatronPolicyWorker`` on NeMo-RL's real Megatron worker
module (``tests/_megatron_worker.py``), built with ``__new__`` (upstream's ``__init__``
needs GPUs). On main, upstream's own ``begin_train_step(loss_fn, gbs, mbs)`` takes no data
-- the AIS prepare step, which needs the whole global batch before the first loss call, has
no place to run -- so ours raises for an AIS loss and hands every other loss to upstream's
method (which then runs: it refuses a second open step). v0.7.0 has no split API.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from _megatron_worker import Placeholder, megatron_worker_modules
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
from nemo_rl_version import NEMO_RL, per_version

from nemo_ais.nemo_rl import AISClippedPGLossFn

pytestmark = pytest.mark.nemo_rl


@pytest.fixture(scope="module")
def modules():
    with megatron_worker_modules() as loaded:
        yield loaded
    assert Placeholder.used == []


@pytest.fixture
def worker(modules, monkeypatch):
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda *args: None)  # CUDA only
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: None)
    cls = modules.ours.AISMegatronPolicyWorker.__ray_actor_class__
    return cls.__new__(cls)


def _undecorated(method):
    """The function under upstream's ``wrap_with_nvtx_name`` (no ``functools.wraps``)."""
    return inspect.getclosurevars(method).nonlocals.get("func", method)


def test_upstreams_split_api_hands_the_worker_no_data(modules):
    upstream = modules.upstream.MegatronPolicyWorkerImpl
    begin = getattr(upstream, "begin_train_step", None)
    assert (begin is not None) == per_version(v0_7_0=False, main=True)
    if begin is not None:
        params = list(inspect.signature(_undecorated(begin)).parameters)
        assert params == ["self", "loss_fn", "gbs", "mbs"]
        chunk = inspect.signature(_undecorated(upstream.train_microbatch)).parameters
        assert list(chunk) == ["self", "data"]  # one chunk per call, the loss run on it


@pytest.mark.parametrize("mode", ["ais", "none"])
def test_begin_train_step_refuses_the_ais_loss(worker, mode):
    with pytest.raises(NotImplementedError, match=r"data_plane\.enabled=false"):
        worker.begin_train_step(AISClippedPGLossFn({"ais": {"mode": mode}}), gbs=4, mbs=2)


def test_begin_train_step_hands_other_losses_to_upstream(worker):
    plain = ClippedPGLossFn(ClippedPGLossConfig())
    if NEMO_RL == "v0.7.0":
        with pytest.raises(AttributeError, match="begin_train_step"):
            worker.begin_train_step(plain, gbs=4, mbs=2)
        return
    worker._train_step_state = {"open": True}  # upstream's own check runs first
    with pytest.raises(RuntimeError, match="a train step is already open"):
        worker.begin_train_step(plain, gbs=4, mbs=2)
