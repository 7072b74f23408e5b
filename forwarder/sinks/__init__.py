"""Where the outbox drains to. `make(config)` picks the sink named by the `sink` setting.

A new sink is a class with `name`, `send(envelopes)` (raises SinkError) and `close()`, plus one
entry in `FACTORIES`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from .base import Sink, SinkError
from .file import FileSink


class SinkUnavailable(ValueError):
    """The configured sink cannot be built (unknown name, missing settings)."""


def _file(config: Any) -> Sink:
    return FileSink(config.sink_path)


def _stdout(config: Any) -> Sink:
    return FileSink(None)


def _eventhub(config: Any) -> Sink:
    raise SinkUnavailable("the eventhub sink is not in this version yet; use --sink file or --sink stdout")


FACTORIES: Dict[str, Callable[[Any], Sink]] = {"file": _file, "stdout": _stdout, "eventhub": _eventhub}


def make(config: Any) -> Sink:
    try:
        factory = FACTORIES[config.sink]
    except KeyError:
        raise SinkUnavailable(f"unknown sink {config.sink!r}; known: {', '.join(FACTORIES)}") from None
    return factory(config)


__all__ = ["FACTORIES", "FileSink", "Sink", "SinkError", "SinkUnavailable", "make"]
