"""Structured JSON logs on stderr: one object per line with ts, level, logger, msg, plus fields.

Log with extra fields: `log.info("published", extra={"fields": {"incarnation": 3}})`.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, Dict

from .clock import iso


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: Dict[str, Any] = {
            "ts": iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                entry.setdefault(key, value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)[-4000:]
        return json.dumps(entry, default=str, ensure_ascii=False)


def setup(level: str = "info") -> None:
    """Route every `forwarder.*` logger (and the root) to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)  # libraries (urllib3, azure) stay quiet unless they warn
    logging.getLogger("forwarder").setLevel(level.upper())


def get(name: str) -> logging.Logger:
    return logging.getLogger(f"forwarder.{name}")


def fields(**kwargs: Any) -> Dict[str, Any]:
    """`extra=` for a log call: `log.info("msg", extra=fields(incarnation=3))`."""
    return {"fields": kwargs}
