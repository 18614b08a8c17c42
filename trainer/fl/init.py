"""A federation's seeds and starting point, shared by the in-process runner and the MQTT coordinator and clients.

:func:`client_seed` seeds one client's local training in one round; :func:`init_model` /
:func:`init_group_models` draw the initial global model(s) from the federation's seed and :func:`init_server_state`
assembles the server's initial state from them (per device group when the strategy aggregates groups apart). The
in-process simulation (:mod:`neurofed.trainer.experiments.runner`), the coordinator (:mod:`neurofed.broker`) and the
edge client (:mod:`neurofed.edge`) call exactly these, so both paths start from, and train with, the same numbers.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from neurofed.trainer.data.dataset import SubjectData
from neurofed.trainer.fl.api import group_key, is_grouped
from neurofed.trainer.models import PER_DEVICE_MODELS, build_model

__all__ = ["client_seed", "init_group_models", "init_model", "init_server_state"]


def client_seed(seed: int, round_idx: int, client_id: str) -> int:
    """Seed of one client's local training in one round (same in-process and over MQTT)."""
    return int(np.random.SeedSequence([seed, round_idx, zlib.crc32(client_id.encode())]).generate_state(1)[0])


def init_model(model_name: str, ref: SubjectData, bn_mode: str, seed: int, **model_kwargs: object) -> nn.Module:
    """The initial global model: architecture for ``ref``'s shape, weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return build_model(model_name, ref.X.shape[1], len(ref.classes), ref.X.shape[2], ref.sfreq, bn_mode,
                       ch_names=ref.ch_names, **model_kwargs)


def init_group_models(
    clients: Mapping[str, SubjectData], groups: Mapping[str, str], model_name: str, bn_mode: str, seed: int,
    **model_kwargs: object,
) -> dict[str, nn.Module]:
    """One model per client group (device profile) and the server's initial state.

    Every group's model is drawn from ``seed`` (architecture from its first client's data shape).
    """
    models: dict[str, nn.Module] = {}
    for cid in sorted(clients):
        g = groups[cid]
        if g not in models:
            models[g] = init_model(model_name, clients[cid], bn_mode, seed, **model_kwargs)
    return models


def init_server_state(models: Mapping[str, nn.Module], prefixes: Sequence[str]) -> dict[str, Tensor]:
    """The server's initial global state: the first group's shared entries + every group's own module."""
    names = sorted(models)
    if not prefixes:
        return {k: v.clone() for k, v in models[names[0]].state_dict().items()}
    state = {k: v.clone() for k, v in models[names[0]].state_dict().items() if not is_grouped(k, prefixes)}
    for g in names:
        own = {k: v for k, v in models[g].state_dict().items() if is_grouped(k, prefixes)}
        if not own:
            raise ValueError(f"the model has no keys under {list(prefixes)} to aggregate per group "
                             f"(use --model {' / '.join(PER_DEVICE_MODELS)})")
        state.update({group_key(g, k): v.clone() for k, v in own.items()})
    return state
