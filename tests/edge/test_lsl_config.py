"""Private LSL sessions: streams created after their consumers started looking are still found."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from neurofed.edge.lsl_config import BASE_PORT, PORT_RANGE, session_config
from tests.lsl_support import unique_name

# A consumer like `edge-client record`: resolve one stream by name, open it, report.
_CONSUMER = """
import sys, pylsl
found = pylsl.resolve_bypred(f"name='{sys.argv[1]}'", 1, 40)
if not found:
    print("NOT FOUND", flush=True); sys.exit(1)
inlet = pylsl.StreamInlet(found[0]); inlet.open_stream(10)
print("FOUND", flush=True)
"""


def test_session_config_text():
    text = session_config("s-1")
    assert "SessionID = s-1" in text and f"PortRange = {PORT_RANGE}" in text and "ResolveScope = machine" in text
    assert os.environ["LSLAPICFG"] and PORT_RANGE > 32  # tests run in such a session (conftest)
    assert f"BasePort = {BASE_PORT}" in text and "BasePort = 17000" in session_config("s-2", base_port=17000)
    # each xdist worker's session has its own port range (tests/lsl_support.py)
    assert "BasePort = " in open(os.environ["LSLAPICFG"]).read()


def test_streams_created_after_their_consumers_are_found():
    """Eight consumers start first, then one process opens 16 outlets (EEG + markers of 8 headsets).

    With liblsl's default 32-port range the consumers' own sockets push the later outlets past the
    probed range and most are never found (the demo failed this way); the session config prevents it.
    """
    import pylsl

    names = [unique_name(f"cfgtest-{i}") for i in range(8)]
    procs = [subprocess.Popen([sys.executable, "-c", _CONSUMER, n], stdout=subprocess.PIPE, text=True)
             for n in names]
    # the consumers are resolving before any outlet exists: each has its resolver's sockets open
    import psutil

    end = time.monotonic() + 30
    while not all(p.poll() is not None or psutil.Process(p.pid).net_connections("inet") for p in procs):
        assert time.monotonic() < end, "the consumers never started resolving"
        time.sleep(0.02)
    outlets = []
    for i, n in enumerate(names):
        outlets.append(pylsl.StreamOutlet(pylsl.StreamInfo(n, "EEG", 4, 100, pylsl.cf_float32, f"{n}-src")))
        outlets.append(pylsl.StreamOutlet(pylsl.StreamInfo(f"{n}-markers", "Markers", 1, 0, pylsl.cf_string,
                                                           f"{n}-mrk")))
    out = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert out == ["FOUND"] * len(names)


def test_a_base_port_without_room_is_refused():
    with pytest.raises(ValueError, match="no room"):
        session_config("s-3", base_port=65500)
