"""Private LSL session for tests: a unique SessionID, machine scope and silent liblsl.

Imported (and :func:`configure_lsl` called) by tests/edge/conftest.py and tests/firmware_sim/conftest.py
before anything loads pylsl, so parallel test runs never see each other's streams.
"""

from __future__ import annotations

import os
import uuid

from neurofed.edge.lsl_config import BASE_PORT, PORT_RANGE, use_private_session


def configure_lsl() -> str:
    """Write a private lsl_api.cfg, point $LSLAPICFG at it (once per process) and return the session id."""
    if os.environ.get("NEUROFED_LSL_SESSION"):
        return os.environ["NEUROFED_LSL_SESSION"]
    # Each pytest-xdist worker (gw0, gw1, ...) takes its own 128-port range above liblsl's default one, so LSL
    # tests on different workers never push each other's outlets out of a shared range (tests/tiers.py).
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    session, _ = use_private_session("neurofed-test", base_port=BASE_PORT + PORT_RANGE * (index % 200))
    os.environ["NEUROFED_LSL_SESSION"] = session
    return session


def unique_name(prefix: str) -> str:
    """A stream name nobody else uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def drain(inlet, until, timeout: float = 20.0, poll: float = 0.005):
    """Pull from an :class:`neurofed.edge.lsl_io.Inlet` until ``until(data, ts)`` holds or ``timeout`` s pass.

    Returns the concatenated ``(data, timestamps)``.
    """
    import time

    import numpy as np

    chunks, stamps = [], []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d, t = inlet.pull()
        if len(t):
            chunks.append(d)
            stamps.append(t)
        if chunks:
            data, ts = np.concatenate(chunks), np.concatenate(stamps)
            chunks, stamps = [data], [ts]
            if until(data, ts):
                return data, ts
        if not len(t):
            time.sleep(poll)
    if not chunks:
        return np.empty((0, inlet.meta.n_channels)), np.empty(0)
    return chunks[0], stamps[0]
