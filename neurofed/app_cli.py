"""The ``neurofed app`` commands: bundle a standalone model with a real recording, serve the browser page (replay,
or live from a LSL stream through the edge's WebSocket bridge), and find the apps shipped in the package.

A CLI module of its own because live serving joins two services: the export's page server
(:mod:`neurofed.export.apps`) and the edge's LSL bridge (:mod:`neurofed.edge.bridge`); export/ itself imports
nothing of edge/ (the import contract).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from neurofed.trainer.errors import NeuroFedError

console = Console()

app_cli = typer.Typer(help="Apps: bundle a standalone model with a real recording, serve the browser page "
                           "(replay, or live from a LSL stream with --stream).", no_args_is_help=True)


@app_cli.command("bundle")
def app_bundle_cmd(
    checkpoint: Annotated[Path, typer.Argument(help="NeuroFed .safetensors checkpoint")],
    subject: Annotated[int, typer.Option(help="EEGMMIDB subject whose imagery runs are replayed")] = 3,
    out: Annotated[Path, typer.Option(help="bundle folder")] = Path("apps/web/data"),
    data_dir: Annotated[str | None, typer.Option(envvar="NEUROFED_DATA")] = None,
    rate: Annotated[float, typer.Option(help="device rate the model is exported for")] = 160.0,
) -> None:
    """Write model.onnx/.json (standalone) and recording.bin/.json (raw windows + cue labels) for apps."""
    from neurofed.export.apps import make_bundle  # lazy: onnx, onnxruntime, torch (keeps --help fast)

    with console.status("exporting the standalone model and the recording..."):
        model, rec = make_bundle(checkpoint, subject, out, data_dir, rate)
    console.print(f"wrote {model}, {model.with_suffix('.json')}, {rec}, {rec.with_suffix('.bin')}")


@app_cli.command("serve")
def app_serve_cmd(
    bundle: Annotated[Path | None, typer.Option(help="bundle folder to serve as data/ (replay page index.html)")] = None,
    web: Annotated[Path | None, typer.Option(help="the page's folder (default: the app shipped in the package)")] = None,
    port: Annotated[int, typer.Option(help="HTTP port of the page")] = 8765,
    host: Annotated[str, typer.Option(help="address of the page and the bridge")] = "127.0.0.1",
    stream: Annotated[str | None, typer.Option(help="LIVE: LSL EEG stream to decode in the page (live.html)")] = None,
    model: Annotated[Path | None, typer.Option(help="LIVE: standalone .onnx (default: the bundle's model.onnx)")] = None,
    source_id: Annotated[str | None, typer.Option(help="LIVE: picks one of several streams named STREAM")] = None,
    markers: Annotated[str | None, typer.Option(help="LIVE: cue marker stream (default STREAM-markers)")] = None,
    mode: Annotated[str, typer.Option(help="LIVE: cue (a window per cue) or sliding")] = "cue",
    step: Annotated[float | None, typer.Option(help="LIVE: sliding step in s (default: the model's)")] = None,
    ws_port: Annotated[int | None, typer.Option(
        help="LIVE: WebSocket port of the bridge (default PORT + 1; 0: any free port, told to the page)")] = None,
    timeout: Annotated[float, typer.Option(help="LIVE: seconds to find the streams")] = 5.0,
    duration: Annotated[float | None, typer.Option(help="stop after this many seconds")] = None,
    stats_out: Annotated[Path | None, typer.Option(help="LIVE: write the bridge's counts (JSON) here at the end")] = None,
    public_key: Annotated[Path | None, typer.Option(
        help="LIVE: serve only a signed release (MODEL.onnx.sig) verified with this key; the page checks it too")] = None,
) -> None:
    """Serve the browser app on http://HOST:PORT/ until Ctrl-C; with --stream, decode a live headset in it.

    Replay: index.html plays a bundle (`neurofed app bundle`). Live: a bridge forwards the LSL stream and its
    cue markers over a WebSocket (ws://HOST:PORT+1) and live.html decodes each window with onnxruntime-web
    (apps/node/live.mjs does the same in Node). See docs/apps.md.
    """
    import tempfile
    import threading

    from neurofed.export.apps import live_data, serve, write_live_address  # lazy: onnx, onnxruntime, torch

    stop = threading.Event()
    if stream is None:
        if model is not None:
            raise typer.BadParameter("--model is for live decoding: give --stream too")
        httpd = serve(web, bundle, host=host, port=port)
        console.print(f"serving the replay on http://{host}:{port}/index.html (Ctrl-C stops)")
        try:
            stop.wait(duration)
        except KeyboardInterrupt:
            pass
        httpd.shutdown()
        return
    from neurofed.edge.bridge import (  # lazy: pylsl, websockets (fast --help)
        BridgeConfig,
        LiveBridge,
        LiveSpec,
    )

    src = model if model is not None else (bundle / "model.onnx" if bundle is not None else None)
    if src is None:
        raise NeuroFedError("--stream needs the model: --model FILE.onnx (a standalone export) or --bundle DIR")
    if not src.is_file():
        raise NeuroFedError(f"{src}: no such model file")
    if public_key is not None:  # refuse an unsigned or foreign model here, in one line, before anything starts
        from neurofed_runtime.release import verify_file

        rel = verify_file(src, public_key)
        console.print(f"release {rel.version} of {src} verified with {public_key}")
    wsp = ws_port if ws_port is not None else port + 1
    with tempfile.TemporaryDirectory(prefix="neurofed-live-") as tmp:
        data, meta = live_data(src, tmp, f"ws://{host}:{wsp}")
        if public_key is not None:  # the page verifies the release itself (apps/web/live.mjs)
            shutil.copyfile(public_key, data / "release.pub")
        cfg = BridgeConfig(stream=stream, source_id=source_id, markers=markers, mode=mode, step=step, host=host,
                           port=wsp, timeout=timeout)
        bridge = LiveBridge(LiveSpec.from_meta(meta), cfg).open()
        try:
            bridge.start()
            if bridge.port != wsp:  # --ws-port 0: the port the system gave, for the page and Node
                write_live_address(data, bridge.url)
            httpd = serve(web, data, host=host, port=port)
        except BaseException:
            bridge.stop()
            raise
        console.print(f"live: {stream!r} -> {bridge.url}; open http://{host}:{port}/live.html "
                      f"(Node: node apps/node/live.mjs --server http://{host}:{port}); Ctrl-C stops")
        try:
            stop.wait(duration)
        except KeyboardInterrupt:
            pass
        httpd.shutdown()
        stats = bridge.stop()
    console.print(f"done: {stats}")
    if stats_out is not None:
        stats_out.write_text(json.dumps(stats, indent=1))


@app_cli.command("path")
def app_path_cmd(
    which: Annotated[str, typer.Argument(help="web (the pages) or node (the Node scripts)")] = "node",
) -> None:
    """Print where the installed apps are (copy the folder above it to run the Node apps: `npm ci` in node/)."""
    from neurofed.export.apps import (  # lazy: onnx, onnxruntime (keeps --help fast)
        packaged_node,
        packaged_web,
    )

    if which not in ("web", "node"):
        raise typer.BadParameter(f"{which!r}: web or node")
    print(packaged_web() if which == "web" else packaged_node())


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add ``neurofed app`` to the CLI."""
    app.add_typer(app_cli, name="app")
