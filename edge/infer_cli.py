"""``edge-client infer``: decode a live LSL headset with an exported ONNX model.

EEG (and cue markers) come in through :mod:`neurofed.edge.lsl_io` into the edge's one ring buffer
(:class:`neurofed.edge.buffer.RingBuffer`); windows are cut by :mod:`neurofed.edge.windowing` (as ``edge-client record``
cuts trials) and decoded by :class:`neurofed.edge.infer.InferenceEngine` (guard, then the decoder step: online EA,
batch-specific BN context, onnxruntime); predictions go out as an LSL stream and optionally as MQTT
JSON messages.

Prediction stream: type ``Predictions``, double64, channels ``class_index, p_<class>..., t_window_end`` (labels,
units and types in ``desc/channels``), and beside it a string marker stream ``<name>-markers`` of the predicted
class names (one per prediction, same timestamp).
Each sample's LSL timestamp is the local LSL clock when the prediction was emitted (real time, whatever
the EEG stream's timestamps say); ``t_window_end`` is the EEG stream's timestamp of the window's last
sample (clock-corrected), which aligns the prediction with the EEG and its cues. The two differ by the
decoding latency on a live headset, and by much more when a recording is replayed faster (or slower)
than real time, since a replayed stream stamps its samples on the recording's own time axis.
The class names are in ``desc/classes``.

Latency (logged at the end) = emission time - local arrival time of the window's last sample.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

from neurofed.edge.buffer import RingBuffer
from neurofed.edge.windowing import CueWindower, SlidingWindower
from neurofed.trainer.errors import NeuroFedError

if TYPE_CHECKING:  # neurofed.edge.infer imports torch and mne: imported when a command runs, not to build the CLI
    from neurofed.edge.infer import InferenceEngine

#: Seconds of EEG the decoder's ring buffer holds beyond one window (cues may announce late). 30 s of stream
#: time is 1.5 s of wall time for a recording replayed at 20x (the demo): a marker delayed by a busy machine
#: still finds its data (at 10 s, a 0.8 s hiccup under load 15 cost one of 180 cues). 64 ch x 160 Hz: 2.5 MB.
BUFFER_SECONDS = 30.0
#: Longest the decoder loop blocks on the EEG inlet when no sample is waiting (it wakes on the first sample:
#: :meth:`neurofed.edge.lsl_io.Inlet.pull`); markers are polled between waits, so a cue is seen within this time.
POLL_SECONDS = 0.001


def prediction_outlet(name: str, source_id: str, classes: Sequence[str], model_hash: str, versioned: bool = False):
    """The LSL outlet predictions are published on (one sample per decoded window, stamped at emission).

    Self-described (XDF meta-data conventions): ``desc/channels`` give each channel's label, unit and type
    (``class_index``: unit ``none``, type ``ClassIndex``; ``p_<class>``: unit ``none``, type ``Probability``;
    ``t_window_end``: unit ``seconds``, type ``Timestamp``), ``desc/classes`` the class names in index order.
    ``versioned`` (``--follow``): one more channel, ``model_version`` (unit ``none``, type ``ModelVersion``), the
    signed release that decoded the window.
    """
    from neurofed.edge.lsl_io import irregular_outlet  # lazy: pylsl (keeps --help fast)

    labels = ["class_index", *[f"p_{c}" for c in classes], "t_window_end"]
    units = ["none", *["none"] * len(classes), "seconds"]
    types = ["ClassIndex", *["Probability"] * len(classes), "Timestamp"]
    if versioned:
        labels, units, types = labels + ["model_version"], units + ["none"], types + ["ModelVersion"]
    return irregular_outlet(name, "Predictions", labels, source_id, "double64",
                            {"classes": list(classes), "model_hash": model_hash, "timestamps": "emission",
                             "meaning": "one sample per decoded window: the predicted class index, the class "
                                        "probabilities, and the EEG stream time of the window's last sample"},
                            units=units, types=types)


def label_outlet(name: str, source_id: str, classes: Sequence[str], model_hash: str):
    """A string marker outlet of the predicted class names (one per decoded window, stamped as the prediction
    stream's sample): what a recorder or a marker-driven app reads without knowing NeuroFed's index order."""
    from neurofed.edge.lsl_io import irregular_outlet  # lazy: pylsl (keeps --help fast)

    return irregular_outlet(name, "Markers", ["predicted_class"], source_id, "string",
                            {"classes": list(classes), "model_hash": model_hash, "timestamps": "emission",
                             "meaning": "the predicted class name of each decoded window"},
                            units=["none"], types=["Markers"])


def make_buffer(engine: InferenceEngine, dtype: type = np.float64) -> RingBuffer:
    """A ring buffer for the engine's stream: one window plus :data:`BUFFER_SECONDS` (and ``tmin``'s reach)."""
    seconds = max(engine.cfg.tmax, 0) + abs(min(engine.cfg.tmin, 0)) + BUFFER_SECONDS
    return RingBuffer(len(engine.stream_ch_names), int(seconds * engine.stream_sfreq) + engine.window_samples,
                      dtype)


def run_loop(
    engine: InferenceEngine,
    eeg,
    markers,
    windower: CueWindower | SlidingWindower,
    sinks: Sequence[Callable[[object], None]],
    cues: Sequence[str],
    stop: threading.Event | None = None,
    max_seconds: float | None = None,
    max_windows: int | None = None,
    clock: Callable[[], float] | None = None,
    follower=None,
) -> dict:
    """Pull, window, decode, publish until ``stop``, ``max_seconds``, ``max_windows`` or Ctrl-C.

    ``eeg``/``markers`` need a ``pull()`` like :class:`neurofed.edge.lsl_io.Inlet` (markers: ``pull_markers()``).
    Every result gets ``t_arrival`` (local LSL time its window's last sample was pulled) and ``t_emit``
    (local LSL time just before the sinks publish it). Returns counts and the latency ``t_emit - t_arrival``
    of the predictions (ms); Ctrl-C ends the loop and still returns them. ``follower``
    (:class:`neurofed.edge.follow.ReleaseFollower`): before each window, a verified pending release replaces the
    decoder (between two windows, in this thread); the counts then hold windows per release version.
    """
    from neurofed.edge.infer import Prediction  # lazy: onnx, onnxruntime (keeps --help fast)

    if clock is None:
        from neurofed.edge.lsl_io import local_clock as clock  # lazy: pylsl (keeps --help fast)

    stop = stop or threading.Event()
    buf = make_buffer(engine)
    counts = {"predictions": 0, "rejections": 0}
    by_version: dict[str, int] = {}
    lat: list[float] = []
    ahead: list[float] = []
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    wanted = {c.lower() for c in cues}
    try:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            data, ts = eeg.pull(wait=POLL_SECONDS)  # returns as soon as a sample arrives
            now = clock()
            if markers is not None:
                for t, label in markers.pull_markers():
                    if label.lower() in wanted:
                        windower.add_cue(t, label, now)
            if len(ts):
                buf.append(data, ts, now)
            for w in windower.poll(buf, now):
                if follower is not None:
                    follower.apply(engine)  # between two windows: the previous one is out, the next not yet in
                    key = str(engine.model_version)
                    by_version[key] = by_version.get(key, 0) + 1
                res = engine.process_window(w)
                res.t_emit = clock()
                for sink in sinks:
                    sink(res)
                if isinstance(res, Prediction):
                    counts["predictions"] += 1
                    lat.append(res.t_emit - res.t_arrival)
                    ahead.append(res.t_end - res.t_arrival)
                else:
                    counts["rejections"] += 1
                if max_windows is not None and counts["predictions"] + counts["rejections"] >= max_windows:
                    stop.set()
    except KeyboardInterrupt:
        pass
    ms = np.array(lat) * 1e3
    return {
        **counts,
        **({"windows_by_version": by_version, "accepted": follower.accepted, "swaps": follower.swaps,
            "refused": follower.refused} if follower is not None else {}),
        "skipped": len(windower.skipped),
        "latency_ms_p50": float(np.median(ms)) if len(ms) else None,
        "latency_ms_p90": float(np.percentile(ms, 90)) if len(ms) else None,
        "latency_ms_p99": float(np.percentile(ms, 99)) if len(ms) else None,
        # how far the stream's own timestamps are from real arrival (0 live; grows under faster replay)
        "stream_time_minus_arrival_s_p50": float(np.median(ahead)) if ahead else None,
    }


def lsl_sink(outlet, labels=None, versioned: bool = False) -> Callable[[object], None]:
    """Push each prediction to ``outlet`` (and its class name to the ``labels`` marker outlet, if given);
    ``versioned``: the release version as the last channel (-1 before any release)."""
    from neurofed.edge.infer import Prediction  # lazy: onnx, onnxruntime (keeps --help fast)

    def push(res: object) -> None:
        if isinstance(res, Prediction):
            tail = [float(-1 if res.model_version is None else res.model_version)] if versioned else []
            outlet.push_sample([float(res.index), *res.probabilities, res.t_end, *tail], res.t_emit)
            if labels is not None:
                labels.push_sample([res.label], res.t_emit)

    return push


def prediction_body(res: object) -> dict:
    """The JSON of one decoded window (MQTT and ``--predictions-out``): a prediction's class, probabilities, window
    end and latency, or a rejection's reason; ``model_version`` under ``--follow`` (the release that decoded it);
    for a cue-locked window the cue's stream time ``onset`` and label ``cue`` (what the session asked for)."""
    from neurofed.edge.infer import Prediction, Rejection  # lazy: onnx, onnxruntime (keeps --help fast)

    if isinstance(res, Prediction):
        body = {
            "label": res.label,
            "index": res.index,
            "probabilities": res.probabilities,
            "t_end": res.t_end,
            "t_emit": res.t_emit,
            "latency_ms": (res.t_emit - res.t_arrival) * 1e3,
        }
    else:
        assert isinstance(res, Rejection)
        body = {"rejected": res.reason, "t_end": res.t_end, "t_emit": res.t_emit,
                "bad_channels": res.bad_channels}
    if res.model_version is not None:
        body["model_version"] = res.model_version
    if res.onset is not None:
        body.update(onset=res.onset, cue=res.cue)
    return body


def mqtt_sink(transport, topic: str) -> Callable[[object], None]:
    def push(res: object) -> None:
        transport.publish(topic, json.dumps(prediction_body(res)).encode(), wait=None)

    return push


def jsonl_sink(fh) -> Callable[[object], None]:
    """Append each decoded window's JSON (:func:`prediction_body`) as one line to the open text file ``fh``
    (flushed per line: a report can read it while the decoder runs)."""
    def push(res: object) -> None:
        fh.write(json.dumps(prediction_body(res)) + "\n")
        fh.flush()

    return push


def log_sink(console) -> Callable[[object], None]:
    from neurofed.edge.infer import Prediction  # lazy: onnx, onnxruntime (keeps --help fast)

    def show(res: object) -> None:
        if isinstance(res, Prediction):
            console.print(
                f"{res.t_end:.3f}  {res.label:<12} "
                + " ".join(f"{p:.2f}" for p in res.probabilities)
                + f"  (context {res.n_context}, EA {res.ea_windows})"
            )
        else:
            console.print(f"{res.t_end:.3f}  [yellow]rejected[/]: {res.reason}")

    return show


def infer(
    stream: Annotated[str, typer.Option(help="EEG LSL stream name")],
    model: Annotated[list[Path] | None, typer.Option(
        help="exported .onnx model (neurofed export; a --standalone export runs the very graph apps run). Repeat "
             "it, or give a folder, for one model per device profile: the one whose profile matches the stream's "
             "channels and rate is used. With --follow: optional, a signed standalone model (MODEL.onnx.sig "
             "beside it) to start with; without it the decoder waits for the retained release")] = None,
    source_id: Annotated[
        str | None, typer.Option(help="EEG stream source_id (picks one of several streams with that name)")
    ] = None,
    markers: Annotated[str | None, typer.Option(help="cue marker stream (default STREAM-markers)")] = None,
    mode: Annotated[str, typer.Option(help="cue (windows locked to cue markers) or sliding")] = "cue",
    step: Annotated[float, typer.Option(help="sliding mode: seconds between windows")] = 0.5,
    cues: Annotated[
        str | None, typer.Option(help="markers that start a window (default: the model's classes)")
    ] = None,
    out_name: Annotated[
        str | None, typer.Option(help="prediction stream name (default STREAM-predictions)")
    ] = None,
    mqtt: Annotated[
        str | None, typer.Option(help="also publish JSON to this broker URL (mqtt://host:port)")
    ] = None,
    mqtt_topic: Annotated[
        str | None, typer.Option(help="MQTT topic (default neurofed/predictions/STREAM)")
    ] = None,
    context: Annotated[
        int | None, typer.Option(help="BN context batch (default: model test batch size)")
    ] = None,
    ea_reference: Annotated[
        Path | None, typer.Option(help=".npy (c x c) offline EA reference covariance (default: identity)")
    ] = None,
    ea_warmup: Annotated[int, typer.Option(help="windows before the running EA mean is used")] = 1,
    threads: Annotated[int, typer.Option(help="onnxruntime intra-op threads")] = 1,
    duration: Annotated[float | None, typer.Option(help="stop after this many seconds")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to find the streams")] = 5.0,
    quiet: Annotated[bool, typer.Option(help="do not print each prediction")] = False,
    stats_out: Annotated[
        Path | None, typer.Option(help="write the run's counts and latency (JSON) here at the end")
    ] = None,
    predictions_out: Annotated[
        Path | None, typer.Option(help="append every decoded window as one JSON line here (as on MQTT: with "
                                       "--follow its release version, in cue mode its cue's time and label; "
                                       "neurofed release report reads it)")
    ] = None,
    follow: Annotated[bool, typer.Option(help="follow signed releases on the broker's release topic and swap to "
                                              "each newer verified one between two windows")] = False,
    pub: Annotated[Path | None, typer.Option(help="--follow: the federation's public release key")] = None,
    broker: Annotated[str | None, typer.Option(help="--follow: broker URL of the release topic "
                                                    "(default: --mqtt)")] = None,
    federation: Annotated[str | None, typer.Option(help="--follow: federation name")] = None,
    release_dir: Annotated[Path, typer.Option(help="--follow: folder for accepted releases")] = Path("releases-in"),
    release_timeout: Annotated[float, typer.Option(help="--follow without --model: seconds to wait for the "
                                                        "first release")] = 30.0,
    ca: Annotated[Path | None, typer.Option(help="--follow: CA certificate for an mqtts:// broker")] = None,
) -> None:
    """Decode a live headset: predictions out as an LSL stream (and MQTT if asked)."""
    from rich.console import Console

    from neurofed.edge.infer import (  # lazy: onnx, onnxruntime (keeps --help fast)
        InferenceEngine,
        StandaloneStep,
        model_files,
        pick_model,
    )
    from neurofed.edge.lsl_io import (  # lazy: pylsl (keeps --help fast)
        Inlet,
        check_marker_stream,
        check_unique,
        find_stream,
    )
    from neurofed.export.decoder import StandaloneModel  # lazy: onnx, onnxruntime (keeps --help fast)
    from neurofed.export.runtime import (  # lazy: onnx, onnxruntime (keeps --help fast)
        OnnxModel,
        read_onnx_meta,
    )

    console = Console()
    if mode not in ("cue", "sliding"):
        raise typer.BadParameter(f"mode {mode!r}: use cue or sliding")
    follower = stop_follow = None
    version = None
    if follow:
        follower, stop_follow, model, version = _start_follow(model, pub, broker or mqtt, federation, release_dir,
                                                              release_timeout, ca, console)
    model = model_files(model or [])  # every model loaded and checked against its metadata before waiting for a stream
    eeg = Inlet(find_stream(name=stream, source_id=source_id, timeout=timeout, unique=False))
    mk = transport = pred_file = None
    # every inlet and connection opened here is closed on any exit, errors included: an inlet left to the garbage
    # collector while its stream's outlet is destroyed crashed liblsl (a segfault in CI)
    try:
        chosen = pick_model(model, eeg.meta.ch_names, eeg.meta.sfreq)
        standalone = bool(read_onnx_meta(chosen).standalone)
        om = StandaloneModel(chosen, threads=threads) if standalone else OnnxModel(chosen, threads=threads)
        ref = None
        if ea_reference is not None:
            try:
                ref = np.load(ea_reference, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise NeuroFedError(f"{ea_reference}: cannot read an EA reference .npy ({exc})") from None
        if follow and not standalone:
            raise NeuroFedError(f"{chosen}: --follow needs a standalone model (releases are standalone graphs)")
        if standalone and (ea_reference is not None or context is not None):
            raise typer.BadParameter("--ea-reference/--context are fixed inside a standalone model's graph")
        engine = InferenceEngine(
            om, eeg.meta.ch_names, eeg.meta.sfreq, context=context, ea_reference=ref, ea_min_windows=ea_warmup,
            stream_units=eeg.meta.units, decoder=StandaloneStep(om, eeg.meta.sfreq) if standalone else None,
        )
        if follower is not None:
            follower.running(om, version)
            engine.model_version = version
        if mode == "cue":
            mk = Inlet(find_stream(name=markers or f"{stream}-markers", timeout=timeout, unique=False))
            check_marker_stream(mk.meta)
            windower = CueWindower(engine.window_samples, engine.stream_sfreq, engine.cfg.tmin,
                                   marker_timeout=engine.cfg.tmax + BUFFER_SECONDS, source=stream)
        else:
            windower = SlidingWindower(engine.window_samples, step, engine.stream_sfreq, source=stream)
        # the inlets are open (and buffering): now refuse ambiguous names
        check_unique([(stream, None, source_id)] + ([(mk.meta.name, None, None)] if mk is not None else []))
        name = out_name or f"{stream}-predictions"
        outlet = prediction_outlet(name, f"{eeg.meta.source_id}-predictions", om.meta.classes, om.meta.model_hash,
                                   versioned=follow)
        names = label_outlet(f"{name}-markers", f"{eeg.meta.source_id}-predictions-markers", om.meta.classes,
                             om.meta.model_hash)
        sinks = [lsl_sink(outlet, names, versioned=follow)] + ([] if quiet else [log_sink(console)])
        if mqtt:
            from neurofed.broker.transport import MqttTransport  # lazy: paho-mqtt (keeps --help fast)

            transport = MqttTransport(mqtt, f"neurofed-infer-{eeg.meta.source_id}").connect()
            sinks.append(mqtt_sink(transport, mqtt_topic or f"neurofed/predictions/{stream}"))
        if predictions_out is not None:
            try:
                pred_file = open(predictions_out, "a", encoding="utf-8")  # noqa: SIM115 - closed below
            except OSError as exc:
                raise NeuroFedError(f"{predictions_out}: cannot write predictions ({exc.strerror})") from None
            sinks.append(jsonl_sink(pred_file))
        console.print(
            f"decoding {stream!r} ({eeg.meta.n_channels} ch @ {eeg.meta.sfreq:g} Hz) with {om.meta.model} "
            f"[{mode}], publishing LSL streams {name!r} and {name + '-markers'!r}"
            + (f" and MQTT {mqtt}" if mqtt else "")
        )
        stop = threading.Event()
        _stop_on_sigterm(stop)
        stats = run_loop(
            engine,
            eeg,
            mk,
            windower,
            sinks,
            (cues.split(",") if cues else om.meta.classes),
            stop,
            duration,
            follower=follower,
        )
    finally:
        if stop_follow is not None:
            stop_follow.set()
        eeg.close()
        if mk is not None:
            mk.close()
        if transport is not None:
            transport.close()
        if pred_file is not None:
            pred_file.close()
    console.print(f"done: {stats}")
    if stats_out is not None:
        stats_out.write_text(json.dumps(stats, indent=1))


def _stop_on_sigterm(stop: threading.Event) -> None:
    """SIGTERM (a service manager stopping the decoder, or a launcher whose children ignore SIGINT, as a background
    job's do) ends the decode loop between two windows: every window decoded so far is published and counted, and
    the stats are written."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())


def _start_follow(model, pub, broker, federation, release_dir, release_timeout, ca, console):
    """``--follow``: check the options, verify the starting model's signature (if any), subscribe to the release
    topic; without a starting model, wait for the first verified release. ``(follower, stop, models, version)``."""
    from neurofed_runtime.release import verify_file

    from neurofed.edge.follow import ReleaseFollower, follow_broker  # lazy: paho, onnxruntime
    from neurofed.export.decoder import StandaloneModel  # lazy: onnxruntime

    if pub is None or broker is None or federation is None:
        raise NeuroFedError("--follow needs --pub (the federation's public release key), --broker and --federation")
    version = None
    if model:
        if len(model) != 1 or Path(model[0]).is_dir():
            raise NeuroFedError("--follow takes one starting --model file (a signed standalone release)")
        version = verify_file(model[0], pub).version  # an unsigned starting model is refused too
    follower = ReleaseFollower(pub, release_dir, StandaloneModel, version=version)
    stop = threading.Event()
    follow_broker(follower, broker, federation, stop, str(ca) if ca else None)
    if not model:
        deadline = time.monotonic() + release_timeout
        while (p := follower.take()) is None:
            if time.monotonic() > deadline:
                stop.set()
                raise NeuroFedError(f"no valid release arrived on neurofed/{federation}/release within "
                                    f"{release_timeout:g} s" + (f" (refused: {follower.refused[-1]})"
                                                                 if follower.refused else ""))
            time.sleep(0.05)
        model, version = [p.path], p.version
        console.print(f"starting with release {version} ({p.path})")
    return follower, stop, model, version


def register(app: typer.Typer) -> None:
    """Add ``edge-client infer``."""
    app.command("infer")(infer)
