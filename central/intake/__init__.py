"""Intake: from an Event Hubs body to the state changes it causes, before anything is committed.

- parse:   JSON + schema -> Envelope, or a BadEnvelope kept whole with its errors
- bounds:  what one envelope may carry (sizes, counts, storable values)
- authn:   the pure verifier of a forwarder's signature and its VM's attested document
- sender:  sender authentication as the ingest gate (trust settings, a content-addressed cache)
- authz:   what an authenticated VM may say about which events
- alerts:  the alerts intake raises (quarantine, refusals, outbox drops, status changes), as values
- plan:    a segment of envelopes -> changes, log rows, alerts and markers, on copies of cached rows

May import: central.model, central.policy, central.store, central.telemetry, schemas.
Must never be imported by: model, policy, store or telemetry. (The runtime commits what it plans.)
"""
