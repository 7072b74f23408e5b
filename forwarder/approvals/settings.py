"""The settings of the approval parts, hooks included: a light module, imported at start, while the parts
themselves (hooks.py, the approver, the reader and its SDK) are imported only when first needed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

DEFAULT_HOOK_DIR = "/etc/se-forwarder/hooks"


@dataclass
class HookSettings:
    hook_dir: str = DEFAULT_HOOK_DIR
    timeout_seconds: float = 300.0
    output_limit: int = 4096
    # uids allowed to own a hook besides root; the service user is added at run time.
    extra_owner_uids: Sequence[int] = ()


@dataclass
class ReaderSettings:
    fast_interval: float = 2.0  # while this VM has a Scheduled event (the queue is not read otherwise)
    slow_interval: float = 60.0  # the longest backoff after queue errors
    visibility_timeout: int = (
        360  # > hook timeout + POST: a crash makes the message visible again after it
    )
    max_dequeue: int = 5  # dequeued more often than this: poison
    batch: int = 16  # messages per receive (one transaction)
    max_clock_skew: float = 300.0
    poison_queue: bool = False  # try moving poison to <queue>-poison (needs send rights VMs lack)
    poison_dir: Optional[str] = None  # local copy of every poison/malformed message (nothing is lost)


@dataclass
class ApprovalSettings:
    state_dir: str
    queue_service_uri: str = ""
    queue_connection_string: str = ""
    # for queue_service_uri: the managed identity credential, or a callable making it when first needed
    credential: Any = None
    reader: ReaderSettings = field(default_factory=ReaderSettings)
    hooks: HookSettings = field(default_factory=HookSettings)
    local_event_types: Sequence[str] = ("Preempt", "Terminate")
    local_approve: bool = False
    require_hook: bool = False  # require_pre_approve_hook

    @property
    def queue_enabled(self) -> bool:
        return bool(self.queue_service_uri or self.queue_connection_string)
