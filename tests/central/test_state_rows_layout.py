"""The State partition's row kinds, as the store's reads rely on them (central.store.state_rows)."""

from central.store import state_rows as rows


def test_no_row_kind_sorts_between_book_and_head() -> None:
    """FleetState.refresh reads the book and head rows as one RowKey range, 'book'..'head': a row kind
    whose keys could fall inside it would be read on every call. Keys of a kind are the kind + a suffix,
    so they can only land there when the kind itself starts at or after 'book' and at or before 'head'."""
    assert rows.BOOK < rows.HEAD
    others = [k for k in rows.ROW_KINDS if k not in (rows.BOOK, rows.HEAD)]
    assert others, "ROW_KINDS lists the other kinds too"
    inside = [k for k in others if rows.BOOK <= k <= rows.HEAD or rows.HEAD.startswith(k)]
    assert inside == []
