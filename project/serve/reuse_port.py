"""A listening socket of its own for each of LitServe's forked HTTP servers, so the kernel spreads connections.

LitServe binds one socket and every forked HTTP server accepts on it. The event loop that wakes first takes every
connection waiting, so a client that opens a few keep-alive connections at once (a reverse proxy, a load generator)
can land all of them on one server while the other idles (measured: docs/benchmarks.md). With ``SO_REUSEPORT`` each
server listens on a socket of its own, bound to the same address, and the kernel hands each new connection to one of
them by a hash of the client's address and port. Linux only: other systems do not balance, so they keep the shared
socket.
"""

import os
import socket
import sys
from collections.abc import Iterator

BALANCES = sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")


def reuse_port_socket(address: tuple, family: socket.AddressFamily) -> socket.socket:
    """A TCP socket bound to ``address`` with ``SO_REUSEPORT``, not yet listening (uvicorn listens on it)."""
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own: restart over TIME_WAIT
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


class SocketPerServer(list):
    """The socket list LitServe gives each HTTP server, which a forked server iterates over as a socket of its own.

    uvicorn listens on every socket its ``Server.startup`` iterates over, in the forked HTTP server: there this
    binds the process's own ``SO_REUSEPORT`` socket (once, and closes it when uvicorn closes what it iterates over
    at shutdown). The list itself holds one socket bound in the parent, which keeps the port while the servers
    start and never listens: the kernel only hands connections to listening sockets.

    Args:
        shared: The socket LitServe bound (a plain bind, so a port in use was already refused); closed here and
            bound again with ``SO_REUSEPORT``, which every socket sharing the port must have.
    """

    def __init__(self, shared: socket.socket) -> None:
        self.address, self.family = shared.getsockname(), shared.family
        shared.close()
        super().__init__([reuse_port_socket(self.address, self.family)])
        self.parent = os.getpid()
        self.own: socket.socket | None = None  # the forked server's, bound on first use there

    def __iter__(self) -> Iterator[socket.socket]:
        if os.getpid() == self.parent:  # not a forked HTTP server: the socket that holds the port
            return super().__iter__()
        if self.own is None:
            self.own = reuse_port_socket(self.address, self.family)
        return iter([self.own])
