"""The edge client's on-disk federation state: atomic safetensors round trip, no pickle."""

from __future__ import annotations

import torch

from neurofed.edge.federation import EdgeState
from neurofed.trainer.fl.client import ClientState, ClientUpdate


def test_edge_state_round_trips(tmp_path):
    g = {"a.weight": torch.randn(3, 2), "bn.weight": torch.ones(4)}
    cur = ClientState(bn={"bn.weight": torch.full((4,), 2.0)})
    st = EdgeState(init=g, current=cur, previous=ClientState(bn={"bn.weight": torch.ones(4)}), last_round=4,
                   last_base="ab" * 32, update=ClientUpdate({"a.weight": torch.zeros(3, 2)}, 45, {}, {"loss": 0.5}))
    p = tmp_path / "fed__S001.safetensors"
    st.save(p)
    assert p.read_bytes()[:8] != b"\x80\x04\x95"  # not a pickle
    got = EdgeState.load(p)
    assert got.last_round == 4 and got.last_base == "ab" * 32
    assert torch.equal(got.init["a.weight"], g["a.weight"])
    assert torch.equal(got.current.bn["bn.weight"], cur.bn["bn.weight"])
    assert torch.equal(got.previous.bn["bn.weight"], torch.ones(4))
    assert got.update.n_samples == 45 and got.update.metrics == {"loss": 0.5}
    assert not list(tmp_path.glob("*.tmp"))


def test_fresh_state_when_no_file(tmp_path):
    st = EdgeState.load(tmp_path / "missing.safetensors")
    assert st.last_round == -1 and st.current is None and st.update is None
