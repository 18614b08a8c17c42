"""Decode a live LSL EEG stream with a standalone model (needs the ``[lsl]`` extra: pylsl).

``python -m neurofed_runtime.lsl model.onnx STREAM`` prints one line per decoded window; :func:`decode_stream` is
the same loop for an app (a callback per result). The stream's channels, units and rate come from its
``desc/channels`` (:meth:`neurofed_runtime.decode.Decoder.from_lsl`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from neurofed_runtime.decode import Decoder, Result
from neurofed_runtime.errors import DataError, NeuroFedError, WindowRejected
from neurofed_runtime.model import StandaloneModel


def open_inlet(name: str, timeout: float = 5.0):
    """An inlet on the EEG stream called ``name`` (its full description read), or a one-line error."""
    try:
        import pylsl
    except ImportError:
        raise NeuroFedError("live LSL decoding needs pylsl: pip install 'neurofed-runtime[lsl]'") from None
    found = pylsl.resolve_byprop("name", name, minimum=1, timeout=timeout)
    if not found:
        raise DataError(f"no LSL stream named {name!r} found within {timeout:g} s")
    inlet = pylsl.StreamInlet(found[0], max_buflen=60, processing_flags=pylsl.proc_clocksync)
    info = inlet.info(timeout=timeout)
    inlet.open_stream(timeout=timeout)  # connected now: samples pushed from here on are received
    return inlet, info


def decode_stream(model: str | os.PathLike | StandaloneModel, name: str,
                  on_result: Callable[[Result | WindowRejected], None], max_windows: int | None = None,
                  max_seconds: float | None = None, timeout: float = 5.0) -> int:
    """Decode the live stream ``name`` until ``max_windows`` windows or ``max_seconds``; returns the windows.

    The model is loaded and checked before the stream is looked for (a bad model fails at once). A stream that
    sends nothing for ``timeout`` seconds (disconnected, or its device stopped) is a :class:`DataError`."""
    m = model if isinstance(model, StandaloneModel) else StandaloneModel(model)
    inlet, info = open_inlet(name, timeout)
    dec = Decoder.from_lsl(m, info)
    n, end = 0, None if max_seconds is None else time.monotonic() + max_seconds
    last = time.monotonic()
    try:
        while (max_windows is None or n < max_windows) and (end is None or time.monotonic() < end):
            chunk, ts = inlet.pull_chunk(timeout=0.05)
            if not ts:
                if time.monotonic() - last > timeout:
                    raise DataError(f"stream {name!r}: no samples for {timeout:g} s after {n} window(s) "
                                    "(disconnected, or its device stopped)")
                continue
            last = time.monotonic()
            for res in dec.stream(chunk):
                on_result(res)
                n += 1
    finally:
        inlet.close_stream()
    return n


def main(argv: list[str] | None = None) -> int:
    """``python -m neurofed_runtime.lsl MODEL STREAM``: print each decoded window; errors are one line, exit 2."""
    ap = argparse.ArgumentParser(prog="python -m neurofed_runtime.lsl", description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("stream")
    ap.add_argument("--windows", type=int, default=None, help="stop after this many windows")
    ap.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--timeout", type=float, default=5.0,
                    help="seconds to find the stream, and of silence before it counts as lost")
    args = ap.parse_args(argv)

    def show(res: Result | WindowRejected) -> None:
        if isinstance(res, WindowRejected):
            print(f"rejected: {res}", flush=True)
        else:
            print(res.label, " ".join(f"{p:.3f}" for p in res.probs), flush=True)

    try:
        decode_stream(args.model, args.stream, show, args.windows, args.seconds, args.timeout)
    except NeuroFedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
