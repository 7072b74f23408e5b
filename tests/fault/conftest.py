"""Fault suite. Each scenario has a short form (unmarked: runs in `make test`) and a full form marked
`slow` (`make fault`). Every server is a real process started through sandbox.processes, stopped by PID."""
