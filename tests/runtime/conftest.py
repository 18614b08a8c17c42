"""Fixtures for the runtime distribution's tests: real exported models (plain and standalone) of a checkpoint trained
for a few SGD steps on real EEGMMIDB trials of S001-S002 (tests/export/conftest.py builds them)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.lsl_support import configure_lsl

configure_lsl()  # a private LSL session before anything loads pylsl (parallel runs never see each other's streams)

from tests.export.conftest import exported_eegnet  # noqa: E402


@pytest.fixture(scope="session")
def eegnet_bs(tmp_path_factory, data_dir) -> tuple[Path, Path]:
    """(checkpoint, plain ONNX export) of a batch-specific EEGNet."""
    return exported_eegnet(tmp_path_factory, data_dir)


@pytest.fixture(scope="session")
def standalone_model(eegnet_bs, tmp_path_factory) -> Path:
    """The standalone export (160 Hz, microvolts) of the same checkpoint."""
    from neurofed.export.standalone import export_standalone

    out = tmp_path_factory.mktemp("rt_sa") / "m.standalone.onnx"
    export_standalone(eegnet_bs[0], out, rate=160.0)
    return out


def with_card(src: Path, dst: Path, **changes) -> Path:
    """A copy of ``src`` whose NeuroFed metadata has ``changes`` (e.g. a card that does not describe its graph)."""
    proto = onnx.load(str(src))
    props = {p.key: p.value for p in proto.metadata_props}
    card = json.loads(props["neurofed"])
    card.update(changes)
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, {**props, "neurofed": json.dumps(card)})
    dst.write_bytes(proto.SerializeToString())
    return dst


def eight_channel_card(src: Path, dst: Path) -> Path:
    """``src`` (21 channels in its graph) with a card declaring 8 channels: the graph/metadata mismatch."""
    card = json.loads({p.key: p.value for p in onnx.load(str(src)).metadata_props}["neurofed"])
    return with_card(src, dst, n_channels=8, ch_names=card["ch_names"][:8])
