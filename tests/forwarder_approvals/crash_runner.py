"""A forwarder approval pass in its own process that SIGKILLs itself right after IMDS accepted the POST.

Used by test_faults.py: `python -m tests.forwarder_approvals.crash_runner SIM_URL CONN TMP_DIR`.
The seam is `Approver.after_post`, an observer our code calls after a successful POST and before
anything is recorded; nothing of our code path is replaced. SIGKILL gives the process no chance to
clean up, exactly like a power cut or the OOM killer.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from .helpers import make_rig


def main() -> None:
    sim_url, conn, tmp = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    rig = make_rig(sim_url, conn, tmp, keep_queue=True)
    rig.service._ready()
    assert rig.service.approver is not None
    rig.service.approver.after_post = lambda event_id: os.kill(os.getpid(), signal.SIGKILL)
    rig.poll()
    sys.exit(3)  # not reached when the message led to a POST


if __name__ == "__main__":
    main()
