"""A reader that stops early (`se-forwarder check --json | head`) closes the pipe: se-forwarder then stops
quietly with exit 141 (128 + SIGPIPE, as a shell reports `yes | head`), never with a traceback.
central/cli/closed_pipe.py does the same for the operators' tools: the forwarder and central never import
each other (they ship as separate distributions), so the few lines are kept once on each side."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, TypeVar

from .exitcodes import CLOSED_PIPE as EXIT_CLOSED_PIPE

F = TypeVar("F", bound=Callable[..., int])


def survives_closed_pipe(main: F) -> F:
    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            code = main(*args, **kwargs)
            sys.stdout.flush()  # what is still buffered fails here, inside the guard, not at exit
            return code
        except BrokenPipeError:
            # Python flushes stdout again at exit: point it at /dev/null so that flush cannot fail too.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_CLOSED_PIPE

    return wrapper  # type: ignore[return-value]
