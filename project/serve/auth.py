"""Who may call the server: an API key that every route but the health probe (and the drawing page) asks for.

A server in a container listens on every address of the container, so anyone who reaches the port reaches the
model. With a key set (``--api_key_file`` or LitServe's ``$LIT_SERVER_API_KEY``), a request must send it as the
``X-API-Key`` header: without it the answer is 401, with a wrong one 403, both counted in ``/metrics`` like any
other answer. ``GET /health`` stays open for a ``HEALTHCHECK`` or a load balancer, which send no key, and so does the
page at ``GET /`` (it holds no data; it asks for the key when ``/predict`` refuses it).

LitServe's own check (``LIT_SERVER_API_KEY``, read when litserve is imported) also guards ``/health``, and leaves
``/metrics`` (a route of ours) open; ``DigitServer.setup_auth`` turns it off in favour of this one.
"""

import hmac
import os
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse

ENV = "LIT_SERVER_API_KEY"  # LitServe's name for it: a key set for plain LitServe works here too


def read_key(path: str | None) -> str | None:
    """The key: the first line of ``path`` (a file only its owner reads: a key on a command line shows in ``ps``),
    else ``$LIT_SERVER_API_KEY``; None when neither is set.

    Raises:
        ValueError: the file cannot be read or holds no key.
    """
    if path is None:
        return os.environ.get(ENV) or None
    try:
        lines = Path(path).read_text().strip().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--api_key_file {path}: cannot read it ({exc.__class__.__name__}: {exc}).") from exc
    if not lines or not lines[0].strip():
        raise ValueError(f"--api_key_file {path}: the file is empty; write the key on its first line.")
    return lines[0].strip()


class RequireKey:
    """ASGI middleware: a request to a route not in ``open_paths`` without the key gets 401, with a wrong key 403.

    Args:
        app: The ASGI application to wrap (inside ``CountRequests``, so that refusals are counted).
        key: What the ``X-API-Key`` header must hold (compared in constant time).
        open_paths: Routes anyone may call (``/health``; ``/``, the page).
    """

    def __init__(self, app: Any, key: str, open_paths: tuple[str, ...] = ("/health",)):
        self.app, self.key, self.open_paths = app, key.encode(), open_paths

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        sent = dict(scope["headers"]).get(b"x-api-key")
        if sent is not None and hmac.compare_digest(sent, self.key):
            return await self.app(scope, receive, send)
        if sent is None:
            answer = JSONResponse(
                {"detail": "this server needs an API key: send it in the X-API-Key header"},
                status_code=401,
                headers={"WWW-Authenticate": "X-API-Key"},
            )
        else:
            answer = JSONResponse({"detail": "wrong API key (the X-API-Key header)"}, status_code=403)
        await answer(scope, receive, send)
