"""One writer of the approval ledger, for the race tests (run as its own process, on Linux or under Wine).

`python ledger_race_worker.py STATE_DIR NAME COUNT`: marks COUNT events NAME-0..NAME-(COUNT-1), each a
read-modify-write of the whole file; prints "done NAME COUNT". Without a cross-process lock, two
writers lose each other's entries (each saves the file it read before the other's write).
"""

import sys

from forwarder.approvals.ledger import Ledger


def main(state_dir: str, name: str, count: int) -> None:
    ledger = Ledger(state_dir)
    for i in range(count):
        ledger.mark_event(f"{name}-{i}", "approved", f"m-{name}-{i}", f"race:{name}")
    print(f"done {name} {count}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
