"""The demo refuses to start, naming the piece, when a part it drives is missing."""

from __future__ import annotations

import pytest

from neurofed import demo_run
from neurofed.demo import DemoConfig
from neurofed.supervise import DemoError
from neurofed.trainer.errors import NeuroFedError


def test_all_pieces_present() -> None:
    demo_run.preflight()  # this build has every piece


def test_missing_piece_is_named(monkeypatch) -> None:
    monkeypatch.setattr(demo_run, "PIECES", (*demo_run.PIECES,
                                             ("edge/: teleport (edge-client teleport)", "neurofed.edge.teleport", None, None),
                                             ("edge/: store", "neurofed.edge.store", "edge-client", "teleport")))
    with pytest.raises(DemoError) as exc:
        demo_run.preflight()
    msg = str(exc.value)
    assert "edge/: teleport (edge-client teleport): cannot import neurofed.edge.teleport" in msg
    assert "`edge-client teleport` is not a registered command" in msg


@pytest.mark.parametrize("kw", [{"algorithm": "fedavg"}, {"subjects": [1]}, {"subjects": [1, 2], "heldout": [2]}, {"heldout": []},
                                {"rounds": 0}])
def test_bad_config_is_one_clear_error(kw) -> None:
    with pytest.raises(NeuroFedError):
        DemoConfig(**kw)
