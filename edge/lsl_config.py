"""liblsl configuration files (``lsl_api.cfg``) for private sessions; imports no pylsl.

liblsl reads its configuration once, when it is loaded, from the file named by ``$LSLAPICFG``, so
these files are written and the variable set *before* anything imports pylsl.

Why the port range is raised: on one machine, liblsl finds streams by probing the per-stream
service ports ``[BasePort, BasePort + PortRange)`` (16572 + 32 by default) on the loopback address.
Every process that opens an inlet or a resolver also takes ports from that range; when inlets start
before their outlets (edge clients waiting for headsets, as in ``neurofed demo``), the outlets
created later get ports past the end of a 32-port range and are never found, except the one stream
that owns the shared 16571 socket (measured here: 8 resolvers started first, 16 outlets, 0 of 8
found in 60 s; with ``PortRange = 128``, 8 of 8 within 1.8 s). 128 ports leave room for dozens of
headsets, recorders and decoders on one host.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

#: Service ports liblsl may use (and probes when resolving on this machine).
PORT_RANGE = 128
#: liblsl's default first service port.
BASE_PORT = 16572


def session_config(session: str, port_range: int = PORT_RANGE, log_level: int = -3,
                   base_port: int = BASE_PORT) -> str:
    """Text of an ``lsl_api.cfg`` for a private session seen only on this machine.

    Parameters
    ----------
    session : str
        ``[lab] SessionID``: streams of other session ids are invisible.
    port_range : int
        ``[ports] PortRange`` (see the module docstring).
    log_level : int
        liblsl log level (-3 silences it).
    base_port : int
        ``[ports] BasePort``: sessions on disjoint port ranges never take each other's ports (parallel test
        workers each get their own range).
    """
    if not 1024 <= base_port <= 65535 - port_range:
        raise ValueError(f"base_port {base_port} leaves no room for {port_range} ports below 65536")
    return (f"[ports]\nBasePort = {base_port}\nPortRange = {port_range}\n\n[lab]\nSessionID = {session}\n\n"
            f"[multicast]\nResolveScope = machine\n\n[log]\nlevel = {log_level}\n")


def use_private_session(prefix: str, directory: str | os.PathLike | None = None,
                        base_port: int = BASE_PORT) -> tuple[str, Path]:
    """Write a private ``lsl_api.cfg`` and point ``$LSLAPICFG`` at it (call before pylsl is imported).

    Returns the session id and the file's path.
    """
    session = f"{prefix}-{uuid.uuid4().hex}"
    folder = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix=f"{prefix}-lsl-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lsl_api.cfg"
    path.write_text(session_config(session, base_port=base_port))
    os.environ["LSLAPICFG"] = str(path)
    return session, path
