"""Commands that broker/ adds to ``neurofed``: broker, coordinator, broker-config, bench mqtt."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neurofed.broker import logger


def broker_cmd(
    port: Annotated[int, typer.Option(help="TCP port (0 = a free one).")] = 1883,
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
) -> None:
    """Run the embedded pure-Python MQTT 3.1.1 broker (amqtt) until Ctrl-C."""
    from neurofed.broker.embedded import EmbeddedBroker  # lazy: paho-mqtt (keeps --help fast)
    from neurofed.broker.secure import cleartext_warning  # lazy: torch (keeps --help fast)

    if (warn := cleartext_warning(host, tls=False, auth=False)) is not None:
        logger.warning(warn)
    b = EmbeddedBroker(host, port or None)
    typer.echo(f"broker listening on {b.url}")
    b.serve_forever()


def coordinator_cmd(
    broker: Annotated[str, typer.Option(help="Broker URL mqtt://host:port or mqtts://host:port.")] = "mqtt://127.0.0.1:1883",
    config: Annotated[Path | None, typer.Option(help="federation.toml (defaults when omitted).")] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder (overrides output.dir of the config).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in the output folder.")] = False,
    ca_certs: Annotated[Path | None, typer.Option(help="CA file for mqtts://.")] = None,
    keepalive: Annotated[int, typer.Option(help="MQTT keepalive seconds.")] = 10,
    mode: Annotated[str | None, typer.Option(
        help="sync (rounds of selected clients) or async (buffered asynchronous aggregation for a long-lived "
        "federation, the [async] settings); overrides federation.mode of the config.")] = None,
) -> None:
    """Coordinate a federation: rounds, deadlines, validation, aggregation, checkpoints, final model."""
    import torch

    from neurofed.broker.config import load_config  # lazy: torch (keeps --help fast)
    from neurofed.broker.coordinator import Coordinator  # lazy: paho-mqtt, torch (keeps --help fast)

    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg = load_config(config)
    if mode is not None:
        from neurofed.broker.config import config_from_dict  # lazy, as above

        raw = cfg.model_dump(by_alias=True)
        raw["federation"]["mode"] = mode
        cfg = config_from_dict(raw, "--mode")
    exporter = None
    if cfg.release.key:  # releases are exported as standalone graphs, signed and published (issue 55)
        from neurofed.export.standalone import export_standalone  # lazy: onnx (keeps --help fast)

        def exporter(ckpt: Path, onnx_path: Path) -> None:
            export_standalone(ckpt, onnx_path)

    coord = Coordinator(cfg, broker, out, resume=resume, exporter=exporter, keepalive=keepalive,
                        ca_certs=str(ca_certs) if ca_certs else None)
    coord.run()
    typer.echo(f"federation {cfg.federation.name}: {coord.server.round} rounds; model in {coord.out}/global_model.safetensors")
    if coord.gate is not None:
        done = [r for r in coord.releases if r["released"]]
        typer.echo(f"{len(coord.releases)} candidate(s) validated, {len(done)} released; history in "
                   f"{coord.gate.folder} (neurofed release list --store {coord.gate.folder})")


def broker_config_cmd(
    out: Annotated[Path, typer.Option(help="Folder for mosquitto.conf, passwd, acl.")] = Path("mosquitto"),
    federation: Annotated[str, typer.Option(help="Federation name (topics neurofed/<name>/...; default: the "
                                            "config's, else neurofed).")] = "",
    config: Annotated[Path | None, typer.Option(help="federation.toml: sizes the packet and queue limits for "
                                                "its model (else a 64 MiB body cap).")] = None,
    clients: Annotated[str, typer.Option(help="Comma-separated client ids; in a federation of device profiles "
                                         "ID:PROFILE (the client may read only its profile's model).")] = "",
    port: Annotated[int, typer.Option(help="Listener port.")] = 1883,
    bind: Annotated[str, typer.Option(help="Listener address.")] = "127.0.0.1",
    password_env: Annotated[str, typer.Option(help="Read '<id>=<password>,...' from this env var (else generated).")] = "",
    tls_cert: Annotated[Path | None, typer.Option(help="Server certificate (enables TLS).")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Server key.")] = None,
    tls_ca: Annotated[Path | None, typer.Option(help="CA file.")] = None,
    rabbitmq: Annotated[bool, typer.Option(
        help="Also write rabbitmq-definitions.json: the same users and ACL for RabbitMQ's MQTT plugin "
             "(`rabbitmqctl import_definitions`; docs/brokers.md).")] = False,
) -> None:
    """Write a locked-down mosquitto.conf, password file and per-client ACL for a federation.

    The packet size limit is the federation's largest legitimate frame (from --config's model) and the queue
    limits are sized for the clients listed (comments in mosquitto.conf say why; docs/security.md).
    """
    import os

    from neurofed.broker.config import load_config  # lazy: torch (keeps --help fast)
    from neurofed.broker.coordinator import largest_body  # lazy: torch, paho-mqtt (keeps --help fast)
    from neurofed.broker.protocol import DEFAULT_MAX_BODY_BYTES  # lazy: torch (keeps --help fast)
    from neurofed.broker.secure import (  # lazy: torch (keeps --help fast)
        SecureBrokerSpec,
        cleartext_warning,
        write_broker_config,
    )

    cfg = load_config(config) if config is not None else None
    federation = federation or (cfg.federation.name if cfg is not None else "neurofed")
    max_body = largest_body(cfg) if cfg is not None else DEFAULT_MAX_BODY_BYTES

    entries = [c.strip().split(":", 1) for c in clients.split(",") if c.strip()]
    ids = [e[0].strip() for e in entries]
    profiles = {e[0].strip(): e[1].strip() for e in entries if len(e) == 2}
    given = {}
    if password_env:
        given = dict(kv.split("=", 1) for kv in os.environ.get(password_env, "").split(",") if "=" in kv)
    spec = SecureBrokerSpec(federation, ids, port=port, bind=bind, tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca,
                            profiles=profiles, max_body=max_body)
    files = write_broker_config(spec, out, given)
    if rabbitmq:
        import json

        from neurofed.broker.secure import rabbitmq_definitions  # lazy, as above

        creds = json.loads(files.credentials.read_text())
        defs = out / "rabbitmq-definitions.json"
        fd = os.open(defs, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # password hashes: owner only
        with os.fdopen(fd, "w") as f:
            json.dump(rabbitmq_definitions(spec, creds), f, indent=1)
        typer.echo(f"wrote {defs} (load it with: rabbitmqctl import_definitions {defs})")
    if (warn := cleartext_warning(bind, tls=tls_cert is not None, auth=True)) is not None:
        logger.warning(warn)
    lim = spec.limits
    typer.echo(f"wrote {files.conf}, {files.passwd}, {files.acl}; credentials in {files.credentials} (mode 600); "
               f"limits for {len(ids)} clients: max_packet_size {lim.max_packet_size}, max_queued_messages "
               f"{lim.max_queued_messages}, max_queued_bytes {lim.max_queued_bytes}")


def bench_mqtt_cmd(
    out: Annotated[Path, typer.Option(help="JSON results.")] = Path("docs/bench/mqtt.json"),
    data_dir: Annotated[Path | None, typer.Option(help="EEGMMIDB folder.")] = None,
    many: Annotated[int, typer.Option(help="Simulated lightweight clients for the scale test.")] = 500,
    broker: Annotated[str, typer.Option(help="'mosquitto' (127.0.0.1:1883) or 'embedded'.")] = "mosquitto",
    only_bytes: Annotated[bool, typer.Option(
        help="Only bytes per round (FedAvg, EEGNet, 24 real edge clients, half per round) vs Flower's gRPC figure.")] = False,
) -> None:
    """Wire bytes vs raw tensor bytes, bytes per round, MQTT vs in-process round overhead, N-client round, latency."""
    from neurofed.broker.bench import (  # lazy: pycryptodome, cryptography, paho-mqtt, torch (keeps --help fast)
        run_bench,
        run_bytes_bench,
    )

    if only_bytes:
        res = run_bytes_bench(out, data_dir, broker)
        typer.echo(f"wrote {out}: " + ", ".join(f"{k}={v}" for k, v in res["summary"].items()))
        return
    res = run_bench(out, data_dir, many, broker)
    typer.echo(f"wrote {out}: " + ", ".join(f"{k}={v}" for k, v in res["summary"].items()))


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this package's commands (and benchmarks) to the CLI."""
    app.command("broker")(broker_cmd)
    app.command("coordinator")(coordinator_cmd)
    app.command("broker-config")(broker_config_cmd)
    bench.command("mqtt")(bench_mqtt_cmd)
