"""The web page at `/`: charts of the fleet's last minutes, a live fleet view with a job view and
the machines' model pools, the caller's batches and a chat playground, plain static files
(api/static/, ES modules, no build step; the charts are uPlot, vendored under
api/static/vendor/), and the security headers every response of the API carries.

The page is public (api/http/auth.py): it holds nothing. What it shows comes from the API with the
key the user types into it, kept in the browser's localStorage and sent as a Bearer token; the
charts poll /v1/fleet/history, the fleet view and the pools /v1/fleet, the batches view
/v1/batches (a file is fetched with the key and handed to the browser as a download); the
playground streams /v1/chat/completions and its stop button aborts the fetch, which cancels the
job (the API cancels a job whose client went away).

Headers: a Content-Security-Policy that allows scripts, styles and connections from this origin
only (no inline script, no eval), `X-Content-Type-Options: nosniff`, no framing, no referrer.
Model output is put into the page as text (`textContent`), never parsed as HTML.
"""

from __future__ import annotations

from flask import Blueprint, Flask, Response, current_app

# Its scripts and styles are the app's static files (api/static/, served under /static/).
bp = Blueprint("page", __name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


@bp.get("/")
def index() -> Response:
    return current_app.send_static_file("index.html")


def _secure(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def init_app(app: Flask) -> None:
    app.after_request(_secure)
    app.register_blueprint(bp)
