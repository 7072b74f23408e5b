"""Integers as Azure Tables holds them: Int32 by default in the SDK, so wider values go as Int64
(the SDK refuses an int past 2**31 at flush otherwise), and Int64 values read back unwrapped."""

from __future__ import annotations

from typing import Any

from azure.data.tables import EdmType, EntityProperty

INT32 = 2**31


def whole(value: Any) -> Any:
    """A column value for an int: as is when Int32 fits, else an explicit Int64 (None stays None)."""
    if isinstance(value, int) and not isinstance(value, bool) and not -INT32 <= value < INT32:
        return EntityProperty(value, EdmType.INT64)
    return value


def plain(value: Any, default: Any = None) -> Any:
    """A column value read back: an Int64 EntityProperty unwrapped, None -> default."""
    if isinstance(value, EntityProperty):
        return value.value
    return default if value is None else value
