"""Central approvals carried out on the VM.

- `naming`: the approval queue's name for a vmId (the same rule central uses).
- `message`: decode and check one approval message on its own (schema, expiry, addressed to this VM).
- `ledger`: the local durable record of events approved and messages handled (no double approval).
- `gate`: the live IMDS check (event present, Scheduled, this VM in Resources) before any POST.
- `approver`: one decision carried out: checks, optional pre-approval hook, POST, the result.
- `queue`: building the Storage QueueClient (managed identity or a connection string).
- `reader`: the worker that polls this VM's queue adaptively and handles each message.
"""
