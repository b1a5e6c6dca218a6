"""Every workaround of LitServe's internals in one place, applied only to the LitServe versions it was tested on.

``DigitServer`` derives from ``server_base()``: ``LitServerWorkarounds`` on a tested version, else LitServe's own
``LitServer`` with a warning (the server then works as LitServe does, without these fixes). Each workaround
overrides or reaches a private name of LitServe; ``tests/test_private_api.py`` lists them and fails when one
changes. What they fix (the figures are in docs/benchmarks.md):

- ``_init_manager``: requests travel over a ``multiprocessing.Queue`` and answers over ZeroMQ (``ZMQAnswers``)
  instead of through the ``multiprocessing.Manager``'s proxies, a synchronous round trip per request and answer.
  LitServe's own ZeroMQ path (``fast_queue=True``) is broken three ways in 0.2.19 (Lightning-AI/LitServe#751): it is
  never selected (``TransportConfig(transport_config=...)``, a field that does not exist), the factory swaps the
  broker's addresses, and the worker's producer announces itself with a ``b"0|__ping__"`` that consumer 0 cannot
  unpickle, which ends that HTTP server's receive loop. The broker, the consumers and the message format here are
  LitServe's own.
- ``_start_server``: each forked HTTP server listens on a socket of its own
  (``project.serve.reuse_port``), so that the kernel spreads connections over them.
"""

import time
import warnings
from typing import Any

import litserve as ls
import zmq
from litserve.transport.zmq_queue import Producer
from litserve.transport.zmq_transport import ZMQTransport

from project.serve.reuse_port import BALANCES, SocketPerServer

TESTED = ("0.2.19",)  # the LitServe versions these workarounds were written for and tested with


class SubscribedProducer(Producer):
    """LitServe's ``Producer`` on an XPUB socket, which sees the consumers' subscriptions arrive.

    A PUB socket drops what it sends before a subscription has reached it, so the first answers of a fresh worker
    could vanish; this one waits until every HTTP server has subscribed, then sends exactly as ``Producer`` does.

    Args:
        address: The broker's backend (its XSUB socket).
        consumers: How many HTTP servers subscribe (one topic each).
        timeout: Seconds to wait for their subscriptions.
    """

    def __init__(self, address: str, consumers: int, timeout: float = 30.0) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.XPUB)
        self._socket.connect(address)
        topics: set[bytes] = set()
        deadline = time.monotonic() + timeout
        while len(topics) < consumers and time.monotonic() < deadline:
            if self._socket.poll(100):
                message = self._socket.recv()
                if message[:1] == b"\x01":  # b"\x01" + topic: a subscription (b"\x00": one withdrawn)
                    topics.add(message[1:])
        if len(topics) < consumers:
            raise RuntimeError(f"only {len(topics)} of {consumers} HTTP servers subscribed to answers in {timeout} s")


class ZMQAnswers(ZMQTransport):
    """LitServe's ``ZMQTransport`` with a producer that waits for its consumers, closable where it was never set up.

    Args:
        backend_address: Where producers (the inference workers) connect: the broker's XSUB socket.
        frontend_address: Where consumers (the HTTP servers) connect: the broker's XPUB socket.
        consumers: How many HTTP servers read answers.
    """

    def __init__(self, backend_address: str, frontend_address: str, consumers: int) -> None:
        super().__init__(backend_address, frontend_address)
        self.consumers = consumers

    def setup(self, operation: int, consumer_id: int | None = None) -> None:
        if operation == zmq.PUB:
            self._zmq = SubscribedProducer(self.backend_address, self.consumers)
        else:
            super().setup(operation, consumer_id)

    def close(self, **kwargs: Any) -> None:
        # LitServe's shutdown closes the main process's copy, which never sent or received: nothing to close there.
        if self._zmq is not None:
            self._zmq.close()

    def __reduce__(self) -> tuple:  # what the worker and HTTP server processes get
        return ZMQAnswers, (self.backend_address, self.frontend_address, self.consumers)


class LitServerWorkarounds(ls.LitServer):
    """``LitServer`` with requests over a pipe and answers over a working ZeroMQ path (``--fast_queue``), and a
    listening socket per HTTP server."""

    def _start_server(
        self,
        port: int,
        num_uvicorn_servers: int,
        log_level: str,
        sockets: list[Any],
        uvicorn_worker_type: str,
        **kwargs: Any,
    ) -> dict:
        if num_uvicorn_servers > 1 and uvicorn_worker_type == "process" and BALANCES:
            sockets = SocketPerServer(sockets[0])  # a listening socket per HTTP server: see project.serve.reuse_port
        return super()._start_server(port, num_uvicorn_servers, log_level, sockets, uvicorn_worker_type, **kwargs)

    def _init_manager(self, num_api_servers: int) -> Any:
        if not self.use_zmq:
            return super()._init_manager(num_api_servers)  # LitServe's own transports
        import multiprocessing

        self.transport_config.transport_type = "zmq"  # starts the broker, a thread of this process
        manager = super()._init_manager(num_api_servers)
        spawn = multiprocessing.get_context("spawn")  # the inference workers are spawned; the HTTP servers fork
        for path in self.litapi_request_queues:
            self.litapi_request_queues[path] = spawn.Queue()
        config = self.transport_config
        self._transport = ZMQAnswers(config.backend_address, config.frontend_address, num_api_servers)
        return manager


def server_base() -> type[ls.LitServer]:
    """``LitServerWorkarounds`` on a LitServe version they were tested with, else ``LitServer`` and a warning."""
    if ls.__version__ in TESTED:
        return LitServerWorkarounds
    warnings.warn(
        f"LitServe {ls.__version__} is not one the serve workarounds were tested with ({', '.join(TESTED)}): "
        "serving with LitServe's own transports and sockets "
        "(project/serve/litserve_workarounds.py says what that leaves out).",
        stacklevel=2,
    )
    return ls.LitServer
