"""The exit codes of `se-forwarder` (docs/forwarder.md). systemd (RestartPreventExitStatus) and
run-forwarder.ps1 do not restart the daemon on USAGE and IMDS_REFUSES: retrying cannot help."""

OK = 0
ERROR = 1              # unexpected error
USAGE = 2              # bad usage or configuration (one line says which setting and what to do)
IMDS_UNAVAILABLE = 3   # IMDS did not answer (check, approve)
IMDS_REJECTED = 4      # IMDS refused the request, or its compute metadata lacks vmId/name (check, approve)
INVALID_DOCUMENT = 5   # the scheduled-events document is invalid (check; run quarantines it)
STATE = 6              # the state directory / outbox / ledger cannot be opened or written
NOT_APPROVED = 7       # approve: rejected by the checks, the hook failed, or the POST failed
IMDS_REFUSES = 8       # run: IMDS refused the configured request (400/404/405) again and again
CHECK_FAILED = 9       # check: something else run needs fails (Event Hubs, queue, identity, hooks, clock...)
CLOSED_PIPE = 141       # the reader of stdout went away (`se-forwarder check --json | head`): stopped quietly
