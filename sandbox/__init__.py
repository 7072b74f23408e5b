"""Faithful local stand-ins for the Azure parts that cannot run on a machine without Azure:
an IMDS simulator, an Event Hubs AMQP server and a small Functions runner. Azurite (npm) is
the Storage stand-in. Used by the tests, the demo and operators rehearsing maintenance."""
