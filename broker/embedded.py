"""A pure-Python default broker (amqtt 0.12.1, MQTT 3.1.1) run in-process on its own thread.

amqtt's default listener is 0.0.0.0:1883, so the bind address and port are always explicit
here (127.0.0.1 and a free port unless told otherwise).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Self

from neurofed.broker import logger
from neurofed.broker.transport import TransportError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class EmbeddedBroker:
    """amqtt broker on a background thread.

    Examples
    --------
    >>> with EmbeddedBroker() as b:   # doctest: +SKIP
    ...     url = b.url                # mqtt://127.0.0.1:<free port>
    """

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, quiet: bool = True) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.quiet = quiet
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def config(self) -> dict:
        return {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }

    async def _main(self) -> None:
        from amqtt.broker import Broker

        self._stop = asyncio.Event()
        broker = Broker(self.config())
        await broker.start()
        self._ready.set()
        await self._stop.wait()
        await broker.shutdown()

    def _run(self) -> None:
        if self.quiet:
            for name in ("amqtt", "transitions"):
                logging.getLogger(name).setLevel(logging.ERROR)
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    def start(self, timeout: float = 10.0) -> Self:
        if port_open(self.host, self.port):
            raise TransportError(f"port {self.host}:{self.port} is already in use")
        self._thread = threading.Thread(target=self._run, name="amqtt-broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise TransportError(f"embedded broker failed to start on {self.host}:{self.port}: {self._error}")
        deadline = time.monotonic() + timeout
        while not port_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.02)
        logger.info("embedded amqtt broker listening on %s", self.url)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)
        self._thread = None

    def serve_forever(self) -> None:
        """Block until interrupted (Ctrl-C), then shut down."""
        self.start()
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
