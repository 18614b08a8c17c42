"""Fixtures for export tests: real checkpoints trained for a few SGD steps on real EEGMMIDB trials."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from neurofed.trainer.checkpoint import ModelMeta, save_checkpoint
from neurofed.trainer.data import PreprocessConfig, load_eegmmidb_subject
from neurofed.trainer.models import build_model

TRAIN_SUBJECTS = (1, 2)


def preprocess_for(model: str) -> PreprocessConfig:
    """21 sensorimotor channels; 80 Hz for EEGNet/Shallow, 160 Hz (640 samples) for Deep4."""
    return PreprocessConfig.from_preset("sensorimotor21", resample=None if model == "deep" else 80.0)


def make_checkpoint(path: Path, model: str, bn_mode: str, data_dir, steps: int = 3, seed: int = 0) -> Path:
    """Build ``model``, take ``steps`` SGD steps on real trials of subjects 1-2, save a checkpoint."""
    cfg = preprocess_for(model)
    subs = [load_eegmmidb_subject(s, cfg, data_dir) for s in TRAIN_SUBJECTS]
    X = np.concatenate([s.X for s in subs])
    y = np.concatenate([s.y for s in subs])
    torch.manual_seed(seed)
    net = build_model(model, X.shape[1], len(subs[0].classes), X.shape[2], subs[0].sfreq, bn_mode)
    opt = torch.optim.SGD(net.parameters(), lr=0.005, momentum=0.9, weight_decay=1e-4)
    rng = np.random.default_rng(seed)
    net.train()
    for _ in range(steps):
        idx = rng.choice(len(X), 16, replace=False)
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(X[idx])), torch.from_numpy(y[idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    hashes = {k: v for s in subs for k, v in s.file_hashes.items()}
    meta = ModelMeta(
        model,
        X.shape[1],
        len(subs[0].classes),
        X.shape[2],
        subs[0].sfreq,
        bn_mode,
        list(subs[0].ch_names),
        list(subs[0].classes),
        cfg.to_dict(),
        "fedbs",
        8,
        hashes,
        {"seed": seed},
    )
    return save_checkpoint(path, net.state_dict(), meta)


_EXPORTED: dict[str, tuple[Path, Path]] = {}


def exported_eegnet(tmp_path_factory, data_dir) -> tuple[Path, Path]:
    """(checkpoint, verified ONNX export) of a batch-specific EEGNet, built once per session (tests/shared_once.py)."""
    from neurofed.export.onnx_export import export_checkpoint
    from tests.shared_once import build_once

    def build(d: Path) -> tuple[Path, Path]:
        ckpt = make_checkpoint(d / "m.safetensors", "eegnet", "batch_specific", data_dir)
        export_checkpoint(ckpt, d / "m.onnx", data_dir)
        return ckpt, d / "m.onnx"

    if "eegnet_bs" not in _EXPORTED:
        os.environ.setdefault("NEUROFED_CACHE", str(tmp_path_factory.mktemp("cache")))
        _EXPORTED["eegnet_bs"] = build_once(tmp_path_factory, "eegnet_bs", build)  # once for all xdist workers
    return _EXPORTED["eegnet_bs"]


@pytest.fixture(scope="session")
def cache_env(tmp_path_factory):
    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def eegnet_bs(tmp_path_factory, data_dir) -> tuple[Path, Path]:
    """(checkpoint, verified ONNX export) of a batch-specific EEGNet."""
    return exported_eegnet(tmp_path_factory, data_dir)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's chromium + chromium-driver, driven by selenium; nothing is downloaded)."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "chromium/chromedriver are not installed (.ci/run installs them)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,760"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(driver), options=opts)  # explicit driver: nothing is downloaded
    yield d
    d.quit()
