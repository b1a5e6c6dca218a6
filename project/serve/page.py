"""``GET /``: one self-contained HTML page to draw a digit on (or drop an image file) and see the served answer.

Nothing is loaded from another host (the server may run offline): ``page.html`` holds its styles and script.
"""

import functools
from pathlib import Path
from typing import Any

from starlette.responses import HTMLResponse

PAGE = Path(__file__).with_name("page.html")


@functools.cache
def html() -> str:
    """The page's text, read once per process."""
    return PAGE.read_text(encoding="utf-8")


def page(request: Any) -> HTMLResponse:
    """``GET /``: the page."""
    return HTMLResponse(html())
