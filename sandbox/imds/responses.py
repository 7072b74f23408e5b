"""An HTTP answer as a value, so routes stay plain functions."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: Dict[str, str] = field(default_factory=dict)


def json_response(status: int, obj: Any, headers: Dict[str, str] | None = None) -> Response:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return Response(status, body, {"Content-Type": "application/json; charset=utf-8", **(headers or {})})


def error(status: int, message: str, **extra: Any) -> Response:
    return json_response(status, {"error": message, **extra})
