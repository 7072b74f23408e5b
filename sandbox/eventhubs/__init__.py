"""A small Event Hubs server speaking AMQP 1.0 on loopback, for the unmodified azure-eventhub SDK.

Run it with `python -m sandbox.eventhubs --port N --hub NAME=PARTITIONS`; see docs/eventhubs-server.md.
"""
