"""The ZeroMQ path that carries answers from LitServe's inference workers to its HTTP servers, made to work.

LitServe 0.2.19 ships it broken three ways (Lightning-AI/LitServe#751): ``LitServer(fast_queue=True)`` never
selects it (``TransportConfig(transport_config=...)``, a field that does not exist), the factory passes the
broker's addresses in the wrong order, and the worker's producer announces itself by sending consumer 0 a
``b"0|__ping__"`` that consumer cannot unpickle, which ends that HTTP server's receive loop: whenever the ping won
the race with the subscription, every later request to that server hung (seen 1 start in 6 under a burst).
``serve.DigitServer`` installs ``ZMQAnswers`` instead; the broker, the consumers and the message format are
LitServe's own.
"""

import time
from typing import Any, Literal

import zmq
from litserve.transport.zmq_queue import Producer
from litserve.transport.zmq_transport import ZMQTransport


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

    def setup(self, operation: Literal[zmq.SUB, zmq.PUB], consumer_id: int | None = None) -> None:
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
