"""A route's JSON answer: the one place a pydantic model becomes an `application/json` response
(SSE framing is api/http/sse.py's)."""

from __future__ import annotations

from flask import Response
from pydantic import BaseModel


def json_response(model: BaseModel) -> Response:
    """`model` as the response's JSON body, status 200."""
    return Response(model.model_dump_json(), mimetype="application/json")
