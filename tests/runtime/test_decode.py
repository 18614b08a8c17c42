"""neurofed_runtime.decode.Decoder on a real held-out subject (S003): a window, a sliding stream, mne.Epochs, and the
channel picking / unit conversion from a stream's description, each equal to the standalone graph run directly."""

from __future__ import annotations

import numpy as np
import pytest
from neurofed_runtime import DataError, Decoder, StandaloneModel, WindowRejected
from neurofed_runtime.channels import lsl_channels

from neurofed.export.standalone import eegmmidb_session_windows

SUBJECT = 3  # held out: the fixture model trained on S001-S002


@pytest.fixture(scope="module")
def session(standalone_model, data_dir):
    """(model, the first imagery session's raw cue-locked windows in microvolts, model channel order)."""
    m = StandaloneModel(standalone_model)
    (name, ws, y, rate), *_ = eegmmidb_session_windows(SUBJECT, list(m.card.ch_names), list(m.card.classes),
                                                        0.0, 4.0, data_dir)
    return m, ws


def _direct(m: StandaloneModel, ws: np.ndarray) -> np.ndarray:
    state, out = m.initial_state(), []
    for w in ws:
        p, state = m.run(w, state)
        out.append(p)
    return np.array(out, np.float64)


def test_windows_in_another_order_and_unit_decode_as_the_graph(session):
    """A stream with more channels, in another order, in volts: picked, reordered, converted, then the graph."""
    m, ws = session
    want = _direct(m, ws)
    labels = list(m.card.ch_names)
    extra = ["Fp1.", "O2", "Samples"]
    order = labels[::-1] + extra
    dec = Decoder(m, ch_names=[c.upper() if i % 2 else c for i, c in enumerate(order)], sfreq=160.0,
                  units=["volts"] * len(labels) + ["volts", "volts", "samples"])
    got = []
    for w in ws:
        stream = np.concatenate([w[::-1] * 1e-6, np.ones((3, w.shape[1]))])  # volts, reversed, extra rows
        res = dec.decode(stream)
        assert res.label == m.card.classes[res.index]
        got.append(res.probs)
    assert np.abs(np.array(got) - want).max() <= 1e-5
    dec.reset()
    assert np.array_equal(dec.state, m.initial_state())


def test_sliding_stream_equals_windows_cut_by_hand(session):
    """Chunks of any size -> one window every step (0.5 s) once 4 s have arrived: the graph on the same cuts."""
    m, ws = session
    cont = np.concatenate(list(ws[:3]), axis=1)  # 12 s of EEG (three trials back to back), (21, 1920)
    dec = Decoder(m, step_s=0.5)
    got = []
    rng = np.random.default_rng(0)
    pos = 0
    while pos < cont.shape[1]:
        n = int(rng.integers(1, 50))
        got += list(dec.stream(cont[:, pos : pos + n].T))
        pos += n
    starts = range(0, cont.shape[1] - 640 + 1, 80)
    want = _direct(m, np.array([cont[:, s : s + 640] for s in starts]))
    assert len(got) == len(want) == 17
    assert np.abs(np.array([r.probs for r in got]) - want).max() <= 1e-5


def test_mne_epochs_decode_as_the_graph(session, data_dir):
    """``Decoder.from_mne(model, epochs.info).decode_epochs(epochs)``: MNE's volts and EEGMMIDB's labels."""
    mne = pytest.importorskip("mne")
    m, ws = session
    raw = mne.io.read_raw_edf(data_dir / "eegmmidb" / f"S{SUBJECT:03d}" / f"S{SUBJECT:03d}R04.edf", preload=True,
                              verbose="error")
    events, ids = mne.events_from_annotations(raw, verbose="error")
    epochs = mne.Epochs(raw, events, {k: v for k, v in ids.items() if k in ("T1", "T2")}, tmin=0.0,
                        tmax=4.0 - 1 / 160, baseline=None, preload=True, verbose="error")
    dec = Decoder.from_mne(m, epochs.info)
    probs, reasons = dec.decode_epochs(epochs)
    assert probs.shape == (len(ws), 2) and reasons == [""] * len(ws)
    assert np.abs(probs - _direct(m, ws)).max() <= 1e-5
    short = mne.Epochs(raw, events, {"T1": ids["T1"]}, tmin=0.0, tmax=2.0, baseline=None, preload=True,
                       verbose="error")
    with pytest.raises(DataError, match="the model takes 640"):
        Decoder.from_mne(m, short.info).decode_epochs(short)


def test_rejected_windows_leave_the_state(session):
    m, ws = session
    dec = Decoder(m)
    dec.decode(ws[0])
    before = dec.state.copy()
    flat = ws[1].copy()
    flat[2] = 0.0
    with pytest.raises(WindowRejected, match=f"flat channel {m.card.ch_names[2]}") as exc:
        dec.decode(flat)
    assert exc.value.bad_channels == {"flat": [m.card.ch_names[2]]}
    assert np.array_equal(dec.state, before)


def test_streams_that_cannot_feed_the_model_are_one_line(session):
    m, _ = session
    labels = list(m.card.ch_names)
    with pytest.raises(DataError, match="runs at 250 Hz but the model was exported for 160 Hz"):
        Decoder(m, labels, sfreq=250.0)
    with pytest.raises(DataError, match=r"missing channels \['C3'\]"):
        Decoder(m, [c for c in labels if c != "C3"], sfreq=160.0)
    with pytest.raises(DataError, match="channel units must be microvolts"):
        Decoder(m, labels, sfreq=160.0, units="furlongs")
    with pytest.raises(DataError, match="raw counts"):
        Decoder(m, labels, sfreq=160.0, units="counts")
    with pytest.raises(DataError, match="window shape"):
        Decoder(m).decode(np.zeros((21, 100)))


class _Node:
    """A stand-in for pylsl's XMLElement (the unit tier opens no LSL object)."""

    def __init__(self, children=None, value=""):
        self.children, self.value = children or {}, value
        self.sibling = None

    def child(self, name):
        return self.children.get(name, _Node())

    def child_value(self, name):
        return self.children[name].value if name in self.children else ""

    def next_sibling(self, name):
        return self.sibling or _Node()

    def empty(self):
        return not self.children and not self.value


class _Info:
    def __init__(self, labels, units):
        chans = [_Node({"label": _Node(value=lab), "unit": _Node(value=u), "type": _Node(value="EEG")})
                 for lab, u in zip(labels, units)]
        for a, b in zip(chans, chans[1:]):
            a.sibling = b
        self._desc = _Node({"channels": _Node({"channel": chans[0]})})
        self.n = len(labels)

    def desc(self):
        return self._desc

    def channel_count(self):
        return self.n

    def name(self):
        return "fake-eeg"

    def type(self):
        return "EEG"

    def nominal_srate(self):
        return 160.0


def test_a_decoder_from_an_lsl_description(session):
    """Labels and units from desc/channels (the XDF convention); mne-lsl's "-6" means microvolts."""
    m, ws = session
    labels = list(m.card.ch_names)
    info = _Info(labels, ["-6"] * len(labels))
    ch = lsl_channels(info)
    assert ch.ch_names == labels and ch.types == ["EEG"] * len(labels) and ch.sfreq == 160.0
    dec = Decoder.from_lsl(m, info)
    assert np.abs(dec.decode(ws[0]).probs - _direct(m, ws[:1])[0]).max() <= 1e-6
