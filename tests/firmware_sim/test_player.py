"""Simulated headsets: loader, LSL pusher timing, counter channel, faults, several headsets."""

from __future__ import annotations

import time

import mne
import numpy as np
import pytest

from neurofed.edge.lsl_io import Inlet, find_stream, local_clock
from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig, play_many
from neurofed.firmware_sim.recording import Recording, load_eegmmidb, load_recording
from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
from neurofed.trainer.data.io import read_raw
from neurofed.trainer.errors import NeuroFedError
from tests.lsl_support import drain, unique_name


@pytest.fixture(scope="module")
def r04(data_dir) -> Recording:
    return load_recording(data_dir / "eegmmidb" / "S001" / "S001R04.edf", RUN_EVENT_LABELS[4])


def _synthetic(n: int = 400, sfreq: float = 100.0, n_ch: int = 4) -> Recording:
    rng = np.random.default_rng(0)
    data = rng.normal(0, 20, (n, n_ch)).astype(np.float32)
    return Recording(data, sfreq, [f"C{i}" for i in range(n_ch)], [(50, "left_fist"), (150, "right_fist")], "synthetic")


def _start(rec: Recording, **kw) -> tuple[HeadsetPlayer, Inlet, Inlet | None]:
    kw.setdefault("linger", 2.0)
    cfg = PlayerConfig(name=unique_name(kw.pop("prefix", "fw")), wait_consumers=5.0, **kw)
    p = HeadsetPlayer(rec, cfg)
    p.start()
    eeg = Inlet(find_stream(name=cfg.name, timeout=5))
    mrk = Inlet(find_stream(name=cfg.marker_name, timeout=5)) if cfg.markers else None
    return p, eeg, mrk


@pytest.mark.unit
def test_loader_units_markers(data_dir, r04):
    raw = read_raw(data_dir / "eegmmidb" / "S001" / "S001R04.edf")
    assert r04.data.dtype == np.float32 and r04.data.shape == (raw.n_times, 64)
    np.testing.assert_allclose(r04.data, (raw.get_data() * 1e6).T, atol=1e-4)  # microvolts
    ev, _ = mne.events_from_annotations(raw, event_id={"T1": 1, "T2": 2}, verbose="error")
    assert [s for s, _ in r04.markers] == list(ev[:, 0])
    assert [lab for _, lab in r04.markers] == ["left_fist" if c == 1 else "right_fist" for c in ev[:, 2]]
    with_rest = load_recording(data_dir / "eegmmidb" / "S001" / "S001R04.edf", RUN_EVENT_LABELS[4], include_rest=True)
    assert {lab for _, lab in with_rest.markers} == {"left_fist", "right_fist", "rest"}


@pytest.mark.unit
def test_eegmmidb_runs_concatenated_with_per_run_labels(data_dir):
    rec = load_eegmmidb(1, data_dir)
    lens = [read_raw(p).n_times for p in sorted((data_dir / "eegmmidb" / "S001").glob("S001R*.edf"))]
    assert rec.n_samples == sum(lens)
    labels = [lab for _, lab in rec.markers]
    assert len(labels) == 45 and labels.count("left_fist") == 23 and labels.count("right_fist") == 22
    assert sum(lens[0] <= s < lens[0] + lens[1] for s, _ in rec.markers) == 15  # run 8's cues shifted
    with pytest.raises(NeuroFedError, match="no task labels"):
        load_eegmmidb(1, data_dir, runs=(1,))


def test_counter_stream_no_loss_and_desc(r04):
    n = 2400
    p, eeg, mrk = _start(r04, speed=40, counter=True, max_samples=n, chunk_size=10)
    assert eeg.meta.ch_names[0] == "Samples" and eeg.meta.ch_names[1:] == r04.ch_names
    assert set(eeg.meta.units[1:]) == {"microvolts"} and eeg.meta.type == "EEG"
    assert eeg.meta.source_id == p.cfg.source_id and eeg.meta.sfreq == 160.0
    data, ts = drain(eeg, lambda d, t: len(t) >= n)
    markers = mrk.pull_markers()  # while the headset still lingers
    p.stop()
    p.join(timeout=10)
    assert np.array_equal(data[:, 0], np.arange(n))  # nothing lost or duplicated
    np.testing.assert_array_equal(data[:, 1:], r04.data[:n])
    np.testing.assert_allclose(np.diff(ts), 1 / 160, atol=1e-6)  # nominal-rate stamps at any speed
    expect = [(s, lab) for s, lab in r04.markers if s < n]
    assert [lab for _, lab in markers] == [lab for _, lab in expect]
    for (t, _), (s, _) in zip(markers, expect):  # marker time = its cue sample's time
        assert data[np.argmin(np.abs(ts - t)), 0] == s and abs(ts[s] - t) < 1e-4


def test_realtime_pacing_and_speed():
    rec = _synthetic(n=200, sfreq=100.0)
    for speed, wall in ((1.0, 1.84), (4.0, 0.46)):
        p, eeg, _ = _start(rec, speed=speed, markers=False, linger=0.5)
        first: list[float] = []

        def until(d, t, first=first):
            first.append(time.monotonic())
            return len(t) >= 200

        _, ts = drain(eeg, until, timeout=10)
        took = first[-1] - first[0]  # wall time from the first chunk (16 samples) to the last
        lag = local_clock() - ts[-1]
        p.stop()
        p.join(timeout=5)
        assert len(ts) == 200 and abs(took - wall) < 0.2, (speed, took)
        if speed == 1.0:  # at real time a sample's stamp is its capture time: the tail just arrived
            assert 0 <= lag < 0.1


def test_loop_offset_jitter():
    rec = _synthetic(n=200)
    p, eeg, mrk = _start(rec, loop=True, max_samples=500, speed=20, counter=True, clock_offset=100.0)
    data, ts = drain(eeg, lambda d, t: len(t) >= 500)
    assert 99.0 < ts[0] - local_clock() + 500 / 100 / 20 < 101.0  # stamps carry the offset
    labels = [lab for _, lab in mrk.pull_markers()]
    p.stop()
    p.join(timeout=5)
    assert np.array_equal(data[:, 0], np.arange(500))
    np.testing.assert_array_equal(data[:, 1:], rec.data[np.arange(500) % 200])
    assert labels == ["left_fist", "right_fist"] * 2 + ["left_fist"]  # cues at 50, 150, 250, 350, 450
    p, eeg, _ = _start(rec, speed=20, jitter=0.002, markers=False, seed=3)
    data, ts = drain(eeg, lambda d, t: len(t) >= 200, timeout=10)
    p.stop()
    p.join(timeout=5)
    resid = ts - (ts[0] + np.arange(200) / 100)
    assert 0.0005 < np.std(resid) < 0.005  # jittered stamps


def test_dropped_chunks_counted():
    rec = _synthetic(n=400)
    p, eeg, _ = _start(rec, speed=20, drop_prob=0.3, counter=True, chunk_size=8, markers=False, seed=1)
    data, ts = drain(eeg, lambda d, t: p.done.is_set() and len(t) >= p.n_pushed, timeout=10)
    p.stop()
    p.join(timeout=5)
    got = data[:, 0].astype(int)
    assert p.n_dropped > 0 and p.n_pushed + p.n_dropped == 400
    assert len(got) == p.n_pushed and np.all(np.diff(got) >= 1) and len(set(got)) == len(got)
    assert np.all(np.diff(ts)[np.diff(got) > 1] > 1.5 / 100)  # gaps are visible in the timestamps


def test_outage_then_inlet_recovers():
    rec = _synthetic(n=600)
    p, eeg, _ = _start(rec, speed=2, outages=((1.0, 1.0),), counter=True, markers=False, chunk_size=5)
    data, _ = drain(eeg, lambda d, t: d[-1, 0] >= 599, timeout=15)
    p.stop()
    p.join(timeout=5)
    got = data[:, 0].astype(int)
    assert got[-1] == 599 and got.min() == 0
    assert not np.any((got >= 100) & (got < 200))  # the outage's samples never arrive
    assert np.all(np.diff(got) >= 1)
    assert np.array_equal(got[got >= 200], np.arange(200, 600))  # inlet re-attached by itself (recover=True)


def test_several_headsets_no_loss():
    rec = _synthetic(n=300)
    cfgs = [PlayerConfig(name=unique_name(f"multi{i}"), speed=10, counter=True, markers=False,
                         wait_consumers=5.0, linger=2.0) for i in range(3)]
    players = play_many([(rec, c) for c in cfgs])
    inlets = [Inlet(find_stream(name=c.name, timeout=5)) for c in cfgs]
    for p, inlet in zip(players, inlets):
        data, _ = drain(inlet, lambda d, t: len(t) >= 300)
        assert np.array_equal(data[:, 0], np.arange(300))
    for p in players:
        p.stop()
        p.join(timeout=5)
    assert len({c.source_id for c in cfgs}) == 3


def test_go_file_holds_the_first_sample(tmp_path):
    """With a go file the headset waits (after its inlets attached) until the launcher creates it."""
    go = tmp_path / "go"
    p, eeg, _ = _start(_synthetic(n=100), markers=False, lead_in=0.2, go_file=str(go), linger=0.5)
    time.sleep(1.0)
    assert p.n_pushed == 0 and not p.ready.is_set()  # inlets are attached, yet nothing streams
    t_go = local_clock()
    go.touch()
    _, ts = drain(eeg, lambda d, t: len(t) >= 100, timeout=10)
    p.join(timeout=5)
    assert len(ts) == 100 and ts[0] >= t_go - 0.05  # sample 0 was captured after the go


@pytest.mark.unit
def test_bad_config():
    with pytest.raises(NeuroFedError, match="lead_in"):
        PlayerConfig(name="x", lead_in=-1)
    with pytest.raises(NeuroFedError, match="speed"):
        PlayerConfig(name="x", speed=0)
    with pytest.raises(NeuroFedError, match="drop_prob"):
        PlayerConfig(name="x", drop_prob=1.5)
