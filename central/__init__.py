"""Central policy for Azure VM Scheduled Events: plain Python, no Functions bindings.

The packages follow the data of one envelope (docs/architecture.md draws the path and the arrows):

  model      the records every stage shares: times, VMs, events, alerts, envelopes (pure)
  policy     the policy document, its checks, rules, windows, budgets, leader, decide (pure, replayable)
  store      Azure Tables: the State table (the one truth), its rows, the log tables
  telemetry  metrics and `se.*` log markers for Azure Monitor
  intake     parse, bound, authenticate, authorize and plan what envelopes change
  runtime    the Function app's calls: ingest, decide, act (queues, webhook), the operator's desk
  cli        the operators' tools (se-policy, se-fleet, what-if, history); nothing else imports them

Each package's docstring says what it may import; tools/import_layers.py (a test) holds them to it.
This module is a map only: it imports nothing. function_app.py uses `central.runtime`.
"""
