"""On-device trial store: same SubjectData as trainer, checksums, torn writes, kill -9 safety."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from neurofed.edge.capture import RawTrial
from neurofed.edge.store import LocalStore, StoreWriteError
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.dataset import load_recordings
from neurofed.trainer.data.eegmmidb import LR_IMAGERY_RUNS, RUN_EVENT_LABELS, subject_files
from neurofed.trainer.data.io import epochs_from_raw, read_raw
from neurofed.trainer.errors import DataError


def _trial(seed: int, label: str = "left_fist", n_ch: int = 3, n_t: int = 50) -> RawTrial:
    data = np.random.default_rng(seed).normal(0, 10, (n_ch, n_t)).astype(np.float32)
    return RawTrial(data, label, float(seed), 100.0, [f"C{i}" for i in range(n_ch)], seed)


def test_store_gives_the_same_subject_data_as_trainer(data_dir, tmp_path):
    """Raw trials of S001 (runs 4/8/12) stored on device -> preprocessing + EA on device == trainer offline."""
    cfg = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    paths = subject_files(data_dir, 1, LR_IMAGERY_RUNS)
    maps = [RUN_EVENT_LABELS[r] for r in LR_IMAGERY_RUNS]
    store = LocalStore(tmp_path / "s1", subject="S001", classes=("left_fist", "right_fist"))
    for p, lm in zip(paths, maps):
        raw = read_raw(p)
        x, labels = epochs_from_raw(raw, lm, cfg.tmin, cfg.tmax)
        for xi, lab in zip(x, labels):
            store.append(RawTrial(xi.astype(np.float32), lab, 0.0, 160.0, list(raw.ch_names)))
    ref = load_recordings(paths, maps, cfg, "S001", ("left_fist", "right_fist"))
    got = LocalStore(tmp_path / "s1").load_subject_data(cfg)  # reopened: meta and classes persisted
    assert got.subject == "S001" and got.classes == ref.classes and got.ch_names == ref.ch_names
    assert got.sfreq == ref.sfreq and np.array_equal(got.y, ref.y) and got.X.dtype == np.float32
    np.testing.assert_allclose(got.X, ref.X, atol=1e-4)  # EA-whitened units
    assert got.n_trials == 45 and len(got.file_hashes) == 45


def test_torn_index_line_orphans_and_corruption(tmp_path):
    store = LocalStore(tmp_path / "st")
    for i in range(3):
        assert store.append(_trial(i)) == i
    with open(tmp_path / "st" / "index.jsonl", "ab") as f:  # crash while writing the 4th index line
        f.write(b'{"seq": 3, "file": "trials/0000')
    (tmp_path / "st" / "trials" / "000003.npz").write_bytes(b"half a file")  # its orphan data file
    reopened = LocalStore(tmp_path / "st")
    assert len(reopened) == 3 and reopened.verify() == []
    assert reopened.append(_trial(9, "right_fist")) == 4  # continues after the orphan, on a fresh line
    lines = (tmp_path / "st" / "index.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [0, 1, 2, 4]
    np.testing.assert_array_equal(LocalStore(tmp_path / "st").read_trial(reopened.entries[-1]), _trial(9).data)
    victim = tmp_path / "st" / "trials" / "000001.npz"
    victim.write_bytes(victim.read_bytes()[:-3] + b"xyz")
    problems = LocalStore(tmp_path / "st").verify()
    assert len(problems) == 1 and "000001.npz: checksum mismatch" in problems[0]
    with pytest.raises(DataError, match="checksum mismatch"):
        LocalStore(tmp_path / "st").load_subject_data(PreprocessConfig(fmin=8, fmax=30))


def test_store_refuses_mismatched_trials(tmp_path):
    store = LocalStore(tmp_path / "st")
    store.append(_trial(0))
    with pytest.raises(DataError, match="channels differ"):
        store.append(_trial(1, n_ch=4))
    with pytest.raises(DataError, match="no trials captured yet"):
        LocalStore(tmp_path / "empty").raw_trials()


def _full_store(tmp_path, n: int = 3) -> tuple[LocalStore, bytes, list[str]]:
    store = LocalStore(tmp_path / "st")
    for i in range(n):
        store.append(_trial(i))
    return store, (tmp_path / "st" / "index.jsonl").read_bytes(), sorted(os.listdir(tmp_path / "st" / "trials"))


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "disk full"), (errno.EFBIG, "file size limit reached"),
                                         (errno.EDQUOT, "disk quota exceeded")])
def test_full_disk_writing_a_trial_file_is_one_error_and_loses_nothing(tmp_path, monkeypatch, code, words):
    """Issue 54 (D4): the disk fills up while a trial's file is written -> one StoreWriteError line naming the
    problem; the trials stored before are intact, nothing half-written is left, and the store goes on once
    there is room."""
    import neurofed.edge.store as store_mod

    store, index, files = _full_store(tmp_path)

    def no_room(path, payload):  # the atomic writer fails part-way (its temp file is removed)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(store_mod, "atomic_write_bytes", no_room)
    with pytest.raises(StoreWriteError) as ei:
        store.append(_trial(7))
    msg = str(ei.value)
    assert "\n" not in msg and words in msg and "storing trial 3" in msg and "3 trials already stored are intact" in msg
    monkeypatch.undo()
    assert (tmp_path / "st" / "index.jsonl").read_bytes() == index
    assert sorted(os.listdir(tmp_path / "st" / "trials")) == files
    again = LocalStore(tmp_path / "st")
    assert len(again) == 3 and again.verify() == []
    assert again.append(_trial(8)) == 3  # room again: the store continues


def test_full_disk_writing_the_index_line_cuts_it_back_and_removes_the_trial_file(tmp_path, monkeypatch):
    """The trial's file was written but the disk fills up in the middle of its index line: the torn line is cut
    off and the uncommitted file removed, so the store reads exactly as before."""
    import neurofed.edge.store as store_mod

    store, index, files = _full_store(tmp_path)
    real_open = open

    class HalfWriter:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            if len(data) > 10:
                return self.f.write(bytes(data[:10]))  # a short write, then no room for the rest
            return _enospc()

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return HalfWriter(f) if str(path).endswith("index.jsonl") and "a" in mode else f

    monkeypatch.setattr(store_mod, "open", fake_open, raising=False)
    with pytest.raises(StoreWriteError, match="disk full .* storing trial 3; the 3 trials already stored are intact"):
        store.append(_trial(7))
    monkeypatch.undo()
    assert (tmp_path / "st" / "index.jsonl").read_bytes() == index
    assert sorted(os.listdir(tmp_path / "st" / "trials")) == files
    again = LocalStore(tmp_path / "st")
    assert len(again) == 3 and again.verify() == [] and again.append(_trial(8)) == 3


def test_a_store_that_cannot_be_created_is_one_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreWriteError, match="cannot create the store"):
        LocalStore(tmp_path / "file" / "st")  # a file where its parent folder should be


def test_full_disk_on_fsync_is_one_error_too(tmp_path, monkeypatch):
    store, index, _ = _full_store(tmp_path, 1)
    monkeypatch.setattr("neurofed.edge.store.os.fsync", _enospc)
    with pytest.raises(StoreWriteError, match="disk full"):
        store.append(_trial(5))
    monkeypatch.undo()
    assert (tmp_path / "st" / "index.jsonl").read_bytes() == index and LocalStore(tmp_path / "st").verify() == []


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from neurofed.edge.capture import RawTrial
    from neurofed.edge.store import LocalStore, StoreWriteError
    st = LocalStore(sys.argv[1])
    i = len(st)
    print("ready", flush=True)
    while True:
        data = np.full((8, 400), float(i), np.float32)
        st.append(RawTrial(data, "left_fist" if i % 2 else "right_fist", float(i), 160.0, [f"C{k}" for k in range(8)]))
        i += 1
""")


@pytest.mark.e2e
def test_kill_9_during_appends_never_corrupts_committed_trials(tmp_path):
    path = tmp_path / "crash"
    counts = []
    for delay in (0.3, 0.05, 0.5):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        st = LocalStore(path)
        assert st.verify() == []  # every committed trial intact
        seqs = [e["seq"] for e in st.entries]
        assert seqs == sorted(set(seqs))
        x, _ = st.raw_trials()
        assert np.all(x[:, 0, 0] == np.arange(len(x)))  # trial k holds value k: nothing lost in between
        counts.append(len(st))
    assert counts[0] > 0 and counts[0] <= counts[1] <= counts[2]  # restarts continue the same store
