"""JSON lines to a file (appended, fsync'd before send returns) or to stdout."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from .base import SinkError


class FileSink:
    """One envelope per line. `path` None writes to stdout (flushed, not fsync'd)."""

    def __init__(self, path: Optional[Path] = None) -> None:
        self.path = Path(path) if path else None
        self.name = f"file:{self.path}" if self.path else "stdout"
        self._fh: Any = None

    def _open(self) -> Any:
        if self._fh is None:
            if self.path is None:
                self._fh = sys.stdout
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "a", encoding="utf-8")
        return self._fh

    def send(self, envelopes: List[Dict[str, Any]]) -> None:
        data = "".join(json.dumps(e, separators=(",", ":"), ensure_ascii=False) + "\n" for e in envelopes)
        try:
            fh = self._open()
            fh.write(data)
            fh.flush()
            if self.path is not None:
                os.fsync(fh.fileno())
        except OSError as exc:
            self._close_quietly()
            raise SinkError(f"cannot write to {self.name}: {exc}; check --sink-file and free space") from exc

    def _close_quietly(self) -> None:
        if self._fh is not None and self._fh is not sys.stdout:
            try:
                self._fh.close()
            except OSError:
                pass
        self._fh = None

    def close(self) -> None:
        if self._fh is sys.stdout:
            sys.stdout.flush()
        self._close_quietly()
