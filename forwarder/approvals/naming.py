"""The name of a VM's approval queue. The SAME rule as central's `central.runtime.approval_queue.queue_name`
(the forwarder never imports central; tests/forwarder_approvals checks both agree):

"vm-" + the vmId lowercased, with every character outside [a-z0-9] turned into "-", runs of "-"
collapsed and "-" trimmed from the ends; when that is empty or longer than 60 characters:
"vm-" + the first 40 hex digits of sha256(vmId). A vmId is a GUID, so in practice "vm-<guid>".
"""

from __future__ import annotations

import hashlib
import re


def queue_name(vm_id: str) -> str:
    body = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9]", "-", vm_id.lower())).strip("-")
    if not body or len(body) > 60:
        body = hashlib.sha256(vm_id.encode("utf-8")).hexdigest()[:40]
    return f"vm-{body}"
