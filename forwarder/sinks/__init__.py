"""Where the outbox drains to."""
