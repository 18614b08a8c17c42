"""Shared fixtures: the real EEGMMIDB data beside the repo, small preprocessed slices."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from neurofed.trainer.data import PreprocessConfig, load_subjects, resolve_data_dir

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data folder (../shared/data or $NEUROFED_DATA)."""
    return resolve_data_dir(os.environ.get("NEUROFED_DATA"))


@pytest.fixture(scope="session")
def small_cfg() -> PreprocessConfig:
    """21 sensorimotor channels at 80 Hz, EA: the reduced protocol."""
    return PreprocessConfig.from_preset("sensorimotor21", resample=80.0)


@pytest.fixture(scope="session")
def subjects4(data_dir, small_cfg, tmp_path_factory):
    """Four real subjects, preprocessed (cached in a session temp folder)."""
    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path_factory.mktemp("cache")))
    return load_subjects([1, 2, 3, 4], small_cfg, data_dir)
