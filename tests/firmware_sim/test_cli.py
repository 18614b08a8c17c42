"""headset-sim CLI: several EEGMMIDB headsets at once; bad input gives one line and exit 2."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from neurofed.edge.lsl_io import Inlet, find_stream
from tests.lsl_support import drain, unique_name

RUN = [sys.executable, "-c", "from neurofed.firmware_sim.cli import main; main()"]


def test_cli_streams_several_subjects(data_dir):
    name = unique_name("cli")
    proc = subprocess.Popen(RUN + ["--subjects", "1,2", "--data-dir", str(data_dir), "--name", name,
                                   "--speed", "10", "--counter", "--duration", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for tag in ("S001", "S002"):
            inlet = Inlet(find_stream(name=f"{name}-{tag}", timeout=15))
            assert inlet.meta.sfreq == 160 and inlet.meta.n_channels == 65
            data, _ = drain(inlet, lambda d, t: len(t) >= 320, timeout=10)
            counts = data[:, 0]
            assert len(counts) >= 320 and np.all(np.diff(counts) == 1)  # consecutive, none lost
            mk = Inlet(find_stream(name=f"{name}-{tag}-markers", timeout=5))
            assert mk.meta.type == "Markers"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert f"{name}-S001" in out and f"{name}-S002" in out and "45 markers" in out


def test_cli_bad_input_one_line(tmp_path):
    r = subprocess.run(RUN + [str(tmp_path / "nope.edf")], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error:") and "file not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run(RUN + ["--subject", "1", "--outage", "abc"], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 2 and "--outage expects START:DURATION" in r.stderr
    r = subprocess.run(RUN, capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 2 and "nothing to play" in r.stderr
