"""Intake: from an Event Hubs body to the state changes it causes, before anything is committed.

- parse:   JSON + schema -> Envelope, or a BadEnvelope kept whole with its errors
- bounds:  what one envelope may carry (sizes, counts, storable values)
- authn:   the pure verifier of a forwarder's signature and its VM's attested document
- attested: the attested document's checks and failure classes (malformed, forgery, trust, time)
- chain:   the signer's certificate chain, walked through AIA as far as it needs
- trust_store: the default trust (certifi's two roots, the shipped intermediates in trust/, an operator PEM)
- aia:     the allowlisted AIA fetcher (the one network call of sender authentication)
- sender:  sender authentication as the ingest gate (AUTHN_MODE, trust settings, a content-addressed cache)
- authz:   what an authenticated VM may say about which events
- alerts:  the alerts intake raises (quarantine, refusals, outbox drops, status changes), as values
- plan:    a segment of envelopes -> changes, log rows, alerts and markers, on copies of cached rows

May import: central.model, central.policy, central.store, central.telemetry, schemas.
Must never be imported by: model, policy, store or telemetry. (The runtime commits what it plans.)
"""
