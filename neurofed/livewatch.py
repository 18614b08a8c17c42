"""Watch the held-out headset and the decoder's prediction stream over LSL, from the demo process.

Latency of one prediction = (wall time, LSL clock, the prediction sample arrived here) - (wall time
the EEG sample that ends its window arrived here). Both inlets are polled by one thread on the
same loopback, so the number covers LSL transport to the decoder, windowing, preprocessing, online
EA, the ONNX forward pass and the LSL hop back. It does not depend on the playback speed (the
simulated headset stamps samples at the nominal rate even when replaying faster than real time).
"""

from __future__ import annotations

import threading
import time

import numpy as np


class LiveWatch(threading.Thread):
    """Poll EEG, marker and prediction streams; keep arrival times.

    Parameters
    ----------
    eeg_name, pred_name : str
        LSL stream names (the marker stream is ``<eeg_name>-markers``).
    """

    def __init__(self, eeg_name: str, pred_name: str, timeout: float = 60.0) -> None:
        super().__init__(name="livewatch", daemon=True)
        self.eeg_name, self.pred_name, self.timeout = eeg_name, pred_name, timeout
        self.stop_evt = threading.Event()
        self.ready = threading.Event()  # EEG, markers and predictions all connected
        self.eeg_ts: list[np.ndarray] = []
        self.eeg_rx: list[np.ndarray] = []
        self.markers: list[tuple[float, str]] = []
        self.preds: list[tuple[float, list[float], float]] = []  # (t_end, sample, arrival)
        self.error: str | None = None

    @staticmethod
    def _inlet(name: str, timeout: float):
        import pylsl

        found = pylsl.resolve_bypred(f"name='{name}'", 1, timeout)
        if not found:
            return None
        inlet = pylsl.StreamInlet(found[0], max_buflen=360, recover=True, processing_flags=pylsl.proc_none)
        inlet.open_stream(timeout=5.0)
        return inlet

    def run(self) -> None:
        import pylsl
        from neurofed_runtime.channels import lsl_channels

        try:
            end = time.monotonic() + self.timeout
            eeg = mk = pred = None
            while (eeg is None or mk is None or pred is None) and time.monotonic() < end \
                    and not self.stop_evt.is_set():
                eeg = eeg or self._inlet(self.eeg_name, 2.0)
                mk = mk or self._inlet(f"{self.eeg_name}-markers", 2.0)
                pred = pred or self._inlet(self.pred_name, 2.0)
            if eeg is None or mk is None:
                missing = [n for n, i in ((self.eeg_name, eeg), (f"{self.eeg_name}-markers", mk)) if i is None]
                self.error = f"LSL stream(s) {missing} not found (waited {self.timeout:.0f} s or until stopped)"
                return
            self.ready.set()
            next_try = 0.0
            t_col: int | None = None
            while not self.stop_evt.is_set():
                busy = False
                _, ts = eeg.pull_chunk(timeout=0.0, max_samples=8192)
                now = pylsl.local_clock()
                if ts:
                    self.eeg_ts.append(np.asarray(ts))
                    self.eeg_rx.append(np.full(len(ts), now))
                    busy = True
                data, ts = mk.pull_chunk(timeout=0.0)
                for d, t in zip(data, ts):
                    self.markers.append((float(t), str(d[0])))
                if pred is None and time.monotonic() > next_try:
                    pred = self._inlet(self.pred_name, 0.05)
                    next_try = time.monotonic() + 0.2
                if pred is not None:
                    if t_col is None:  # the window end's channel, by its label (--follow adds model_version after it)
                        labels = lsl_channels(pred.info(timeout=5.0)).ch_names
                        t_col = labels.index("t_window_end") if "t_window_end" in labels else len(labels) - 1
                    data, ts = pred.pull_chunk(timeout=0.0)
                    now = pylsl.local_clock()
                    for d in data:  # stamped at emission (neurofed.edge.infer_cli.prediction_outlet)
                        self.preds.append((float(d[t_col]), [float(v) for v in d[:t_col]], now))
                if not busy:
                    time.sleep(0.0005)
        except Exception as exc:  # noqa: BLE001 - reported by the demo
            self.error = f"{type(exc).__name__}: {exc}"

    # ------------------------------------------------------------------ results
    def latencies_ms(self) -> np.ndarray:
        """Per prediction: arrival of the prediction - arrival of its window's last EEG sample (ms)."""
        if not self.eeg_ts or not self.preds:
            return np.empty(0)
        ts = np.concatenate(self.eeg_ts)
        rx = np.concatenate(self.eeg_rx)
        order = np.argsort(ts, kind="stable")
        ts, rx = ts[order], rx[order]
        out = []
        for t_end, _, arrival in self.preds:
            i = int(np.clip(np.searchsorted(ts, t_end), 0, len(ts) - 1))
            j = i if i == 0 or abs(ts[i] - t_end) < abs(ts[i - 1] - t_end) else i - 1
            if abs(ts[j] - t_end) < 0.01:
                out.append((arrival - rx[j]) * 1e3)
        return np.asarray(out)

    def labelled(self, classes: list[str], tmax: float) -> tuple[np.ndarray, np.ndarray]:
        """(true, predicted) class indices: each prediction matched to the cue whose window ends at its t_end."""
        cues = [(t, lab) for t, lab in self.markers if lab in classes]
        if not cues:
            return np.empty(0, int), np.empty(0, int)
        onsets = np.array([t for t, _ in cues])
        y_true, y_pred = [], []
        for t_end, sample, _ in self.preds:
            k = int(np.argmin(np.abs(onsets + tmax - t_end)))
            if abs(onsets[k] + tmax - t_end) < 0.1:
                y_true.append(classes.index(cues[k][1]))
                y_pred.append(round(sample[0]))
        return np.asarray(y_true), np.asarray(y_pred)
