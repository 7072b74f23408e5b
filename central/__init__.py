"""Central policy for Azure VM Scheduled Events: plain Python, no Functions bindings.

`central.service.CentralService` is the one entry point function_app.py uses. Everything below it
is a small module with one job: envelopes (parse + validate), registry (events across VMs),
policy (rules, windows, budgets), leader (election + failover), approvals (per-VM queues),
alerts (webhooks), store (Azure Table storage log), settings (app settings -> clients).
"""
