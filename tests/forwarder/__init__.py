"""Forwarder tests: units, and the forwarder as a real process against the IMDS simulator."""
