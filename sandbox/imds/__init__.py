"""The IMDS simulator: Azure's Instance Metadata Service Scheduled Events, faithfully, on loopback.

Run it alone with `python -m sandbox.imds --port N` (see docs/imds-simulator.md). One process serves
several VMs (`/vms/<name>/metadata/...`; plain `/metadata/...` is the first VM) and an admin API
under `/admin` to schedule events, inject faults and read the request log.

Modules, one job each: `versions` (what each api-version shows), `clock` (time scale, NotBefore),
`identity` (instance metadata), `events` (an event and its admin request), `fabric` (state and
lifecycle, thread-safe), `faults`, `ratelimit`, `requestlog`, `metadata` (the /metadata routes),
`admin` (the /admin routes), `server` (HTTP plumbing), `__main__` (CLI).
"""
