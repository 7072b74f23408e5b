"""Runnable examples for users of the pipeline's data (not imported by forwarder/ or central/)."""
