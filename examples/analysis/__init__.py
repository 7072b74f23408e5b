"""Example analysis of Event Hubs Capture files of the scheduled-events hub (docs/analytics.md).

`python -m examples.analysis --help`. Reads Capture's Avro files with fastavro, the CloudEvents inside
with the project's envelope schema, and answers three questions: how much notice each event type gives,
how long before NotBefore approvals land, and how many events each group sees per week.
"""
