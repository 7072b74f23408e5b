"""On-VM agent: polls IMDS Scheduled Events and publishes each incarnation."""

__version__ = "0.1.0"
