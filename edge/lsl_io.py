"""The only edge module that imports pylsl: resolve streams, open inlets, pull numpy chunks.

Everything downstream (ring buffer, trial cutting, preprocessing, store) works on plain arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pylsl
from neurofed_runtime.channels import lsl_channels
from pylsl.util import LostError
from pylsl.util import TimeoutError as LslTimeout

from neurofed.trainer.errors import NeuroFedError


class StreamError(NeuroFedError):
    """An LSL stream cannot be found, has the wrong shape, or was lost."""


#: seconds :func:`find_stream` spends listing the visible streams when none matched
LIST_WAIT_S = 1.0

#: Inlet processing: liblsl flags applied inside the inlet. Clock synchronisation is done here (see
#: :meth:`Inlet.pull`) rather than with ``proc_clocksync``: after a stream recovers, liblsl's in-inlet clock
#: sync makes every pull time out until a fresh offset arrives, which never happens once the outlet is gone,
#: so already received samples would be stuck.
PROCESSING = {
    "none": pylsl.proc_none,
    "clocksync": pylsl.proc_none,
    "dejitter": pylsl.proc_dejitter,
    "all": pylsl.proc_dejitter | pylsl.proc_monotonize,
}
_NP_DTYPES = {pylsl.cf_float32: np.float32, pylsl.cf_double64: np.float64, pylsl.cf_int8: np.int8,
              pylsl.cf_int16: np.int16, pylsl.cf_int32: np.int32, pylsl.cf_int64: np.int64}
#: Seconds :func:`find_stream` waits for a second stream matching the same query (ambiguity check; liblsl
#: found a second same-named outlet on this machine after ~0.5 s, measured with PortRange 128).
AMBIGUITY_WAIT = 1.0
#: Seconds between clock-offset refreshes.
CLOCK_REFRESH = 5.0


@dataclass(frozen=True)
class StreamMeta:
    """What an outlet says about itself (from its full XML description)."""

    name: str
    type: str
    source_id: str
    sfreq: float
    n_channels: int
    ch_names: list[str]
    units: list[str]
    channel_format: int
    hostname: str
    uid: str = ""  # one outlet's identity: a re-created outlet keeps its source_id but gets a new uid

    @property
    def is_string(self) -> bool:
        return self.channel_format == pylsl.cf_string


def local_clock() -> float:
    """LSL clock in seconds."""
    return pylsl.local_clock()


def _predicate(name: str | None, stype: str | None, source_id: str | None) -> str:
    parts = [f"{k}='{v}'" for k, v in (("name", name), ("type", stype), ("source_id", source_id)) if v]
    if not parts:
        raise StreamError("give at least one of stream name, type or source_id to look for")
    return " and ".join(parts)


def find_stream(name: str | None = None, stype: str | None = None, source_id: str | None = None,
                timeout: float = 5.0, unique: bool = True):
    """Resolve one stream by name/type/source_id within ``timeout`` seconds.

    Like mne-lsl, an ambiguous query is an error, never "the first one": with ``unique`` (default) it
    waits :data:`AMBIGUITY_WAIT` seconds for another match (:func:`check_unique`). Consumers that must
    not lose the first samples open their inlets first with ``unique=False`` and call
    :func:`check_unique` on all their queries once afterwards (inlets buffer meanwhile).

    Raises
    ------
    StreamError
        Listing the streams that are visible when none matches, or the candidates when several match.
    """
    pred = _predicate(name, stype, source_id)
    found = pylsl.resolve_bypred(pred, 1, timeout)
    if not found:
        # the listing waits 1 s: at 0.5 s a loaded 2-core machine missed a stream that was there (a test flake)
        visible = sorted(f"{i.name()} ({i.type()}, {i.source_id()})" for i in pylsl.resolve_streams(LIST_WAIT_S))
        raise StreamError(f"no LSL stream matching {pred} within {timeout:g} s; visible: {visible or 'none'} "
                          "(a stream on this machine that stays invisible while others show: raise [ports] "
                          "PortRange in lsl_api.cfg, see edge/lsl_config.py)")
    if unique:
        check_unique([(name, stype, source_id)])
    return found[0]


def check_unique(queries: Sequence[tuple[str | None, str | None, str | None]], wait: float = AMBIGUITY_WAIT) -> None:
    """Raise if any ``(name, type, source_id)`` query matches several streams (one resolve of ``wait`` s for all).

    Raises
    ------
    StreamError
        Naming the query and its candidates (name, type, source_id, host).
    """
    visible = pylsl.resolve_streams(wait)
    for name, stype, source_id in queries:
        hits = {i.uid(): i for i in visible
                if (name is None or i.name() == name) and (stype is None or i.type() == stype)
                and (source_id is None or i.source_id() == source_id)}
        if len(hits) > 1:
            cands = sorted(f"{i.name()} (type {i.type()}, source_id {i.source_id()}, host {i.hostname()})"
                           for i in hits.values())
            raise StreamError(f"{len(cands)} LSL streams match {_predicate(name, stype, source_id)}: {cands}; "
                              "name the one to use (e.g. by its source_id)")


def check_marker_stream(meta: StreamMeta) -> None:
    """Refuse a cue stream that is neither strings nor mne-lsl's one-hot annotations (irregular rate).

    Recording and decoding accept the same marker streams.
    """
    if not meta.is_string and not (meta.type.lower() == "annotations" and meta.sfreq == 0):
        raise StreamError(f"marker stream {meta.name!r} must carry strings or one-hot annotations "
                          f"(it is {meta.type!r} at {meta.sfreq:g} Hz)")


def _meta(info) -> StreamMeta:
    ch = lsl_channels(info)  # desc/channels: the runtime's reading (one rule for every consumer)
    names, units, n = ch.ch_names, ch.units, info.channel_count()
    return StreamMeta(info.name(), info.type(), info.source_id(), float(info.nominal_srate()), n, names, units,
                      int(info.channel_format()), info.hostname(), info.uid())


class Inlet:
    """An inlet that pulls numpy chunks without blocking (``timeout=0``), recovering lost streams.

    Parameters
    ----------
    info : pylsl.StreamInfo
        From :func:`find_stream`.
    processing : str
        Key of :data:`PROCESSING`: ``clocksync`` (default) adds the remote clock offset (refreshed every
        :data:`CLOCK_REFRESH` s); ``dejitter``/``all`` also smooth timestamps in liblsl; ``none`` gives raw stamps.
    max_buflen : int
        Seconds of data liblsl buffers if we fall behind.
    max_chunk : int
        Largest chunk one :meth:`pull` returns.
    """

    def __init__(self, info, processing: str = "clocksync", max_buflen: int = 360, max_chunk: int = 4096,
                 open_timeout: float = 5.0) -> None:
        if processing not in PROCESSING:
            raise StreamError(f"unknown processing {processing!r}; choose from {sorted(PROCESSING)}")
        self._inlet = pylsl.StreamInlet(info, max_buflen=max_buflen, recover=True,
                                        processing_flags=PROCESSING[processing])
        try:
            full = self._inlet.info(timeout=open_timeout)
        except LslTimeout:
            raise StreamError(f"stream {info.name()!r} did not answer within {open_timeout:g} s") from None
        self.meta = _meta(full)
        self.max_chunk = max_chunk
        dtype = _NP_DTYPES.get(self.meta.channel_format)
        self._buf = None if dtype is None else np.empty((max_chunk, self.meta.n_channels), dtype)
        self.dtype = dtype or object
        self._inlet.open_stream(timeout=open_timeout)
        self._clocksync = processing != "none"
        self.offset = 0.0  # estimated in the background; first refresh at the first pull
        self._next_sync = 0.0

    def _refresh_offset(self) -> None:
        now = pylsl.local_clock()
        if now < self._next_sync:
            return
        try:
            self.offset = float(self._inlet.time_correction(timeout=0.02))
            self._next_sync = now + CLOCK_REFRESH
        except (LslTimeout, LostError):  # keep the last estimate (e.g. while the stream is away); retry soon
            self._next_sync = now + 0.5

    def pull(self, wait: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Samples available now: ``(data (n, channels) copy in the stream's dtype, timestamps (n,) float64)``.

        ``wait`` > 0 (numeric streams): if nothing is available, block up to ``wait`` seconds for the first
        sample and return as soon as it arrives (liblsl's ``pull_sample`` wakes on data, whereas
        ``pull_chunk`` with a timeout waits for the whole timeout), so a decoder loop need not sleep between
        polls and loses no time to the poll interval.

        Raises
        ------
        StreamError
            When the stream is lost for good (not recoverable).
        """
        if wait > 0 and self._buf is not None and not self._inlet.samples_available():
            try:
                first, t0 = self._inlet.pull_sample(timeout=wait)
            except LostError:
                raise StreamError(f"stream {self.meta.name!r} ({self.meta.source_id}) was lost") from None
            except LslTimeout:
                first, t0 = None, None
            if t0 is None:
                return self._buf[:0].copy(), np.empty(0)
            rest, ts = self.pull()
            head = np.asarray(first, dtype=self._buf.dtype).reshape(1, -1)
            return np.concatenate([head, rest]), np.concatenate([self._sync([t0]), ts])
        try:
            if self._buf is None:
                data, ts = self._inlet.pull_chunk(timeout=0.0, max_samples=self.max_chunk)
                out = np.empty((len(ts), self.meta.n_channels), dtype=object)
                if len(ts):
                    out[:] = data
                return out, self._sync(ts)
            _, ts = self._inlet.pull_chunk(timeout=0.0, max_samples=self.max_chunk, dest_obj=self._buf)
        except LostError:
            raise StreamError(f"stream {self.meta.name!r} ({self.meta.source_id}) was lost") from None
        except LslTimeout:  # defensive: never let a timeout escape a non-blocking pull
            return np.empty((0, self.meta.n_channels), np.float32), np.empty(0)
        n = len(ts)
        return self._buf[:n].copy(), self._sync(ts)

    def _sync(self, ts) -> np.ndarray:
        ts = np.asarray(ts, np.float64)
        if self._clocksync and len(ts):
            self._refresh_offset()
            ts = ts + self.offset
        return ts

    def pull_markers(self) -> list[tuple[float, str]]:
        """Markers available now as ``(timestamp, label)``.

        String streams give their first channel; numeric streams are read as one-hot annotations
        (mne-lsl's default encoding): every non-zero channel yields its label.
        """
        data, ts = self.pull()
        if self.meta.is_string:
            return [(float(t), str(row[0])) for row, t in zip(data, ts)]
        return [(float(t), self.meta.ch_names[k]) for row, t in zip(data, ts) for k in np.flatnonzero(row)]

    def time_correction(self, timeout: float = 2.0) -> float:
        """Offset (s) to add to remote timestamps to get local ones."""
        try:
            return float(self._inlet.time_correction(timeout=timeout))
        except LslTimeout:
            raise StreamError(f"stream {self.meta.name!r}: no clock offset within {timeout:g} s") from None

    def samples_available(self) -> int:
        return int(self._inlet.samples_available())

    def close(self) -> None:
        if self._inlet is not None:
            self._inlet.close_stream()
            self._inlet = None



def irregular_outlet(
    name: str, stype: str, labels: list[str], source_id: str, fmt: str = "float32",
    extra_desc: dict[str, str | list[str]] | None = None, units: Sequence[str] | None = None,
    types: Sequence[str] | None = None,
):
    """An irregular-rate outlet (e.g. decoded predictions), channels described in ``desc/channels`` (the XDF
    meta-data convention: ``label``, and ``unit``/``type`` when given).

    Parameters
    ----------
    fmt : str
        ``float32``, ``double64`` or ``string``.
    units, types : sequence of str, optional
        Per channel, its unit and type.
    extra_desc : dict, optional
        More ``desc`` entries: a string value becomes ``<key>value</key>``; a list becomes
        ``<key><item>v</item>...</key>`` with the singular of key (``classes`` -> ``class``).
    """
    formats = {"float32": pylsl.cf_float32, "double64": pylsl.cf_double64, "string": pylsl.cf_string}
    if fmt not in formats:
        raise StreamError(f"unsupported outlet format {fmt!r}; use float32, double64 or string")
    cf = formats[fmt]
    info = pylsl.StreamInfo(name, stype, len(labels), pylsl.IRREGULAR_RATE, cf, source_id)
    chans = info.desc().append_child("channels")
    for i, lab in enumerate(labels):
        ch = chans.append_child("channel")
        ch.append_child_value("label", lab)
        if units is not None:
            ch.append_child_value("unit", units[i])
        if types is not None:
            ch.append_child_value("type", types[i])
    for key, value in (extra_desc or {}).items():
        if isinstance(value, str):
            info.desc().append_child_value(key, value)
        else:
            node = info.desc().append_child(key)
            for v in value:
                node.append_child_value(key[:-2] if key.endswith("es") else key.rstrip("s"), v)
    return pylsl.StreamOutlet(info)
