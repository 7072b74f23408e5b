"""A small local Functions runner: runs a v2-model FunctionApp from its own binding metadata.

There is no Functions host on this machine. The runner reads `app.get_functions()` and each
function's function.json, resolves `%SETTING%` names and connections from a local.settings.json-style
file like the host, and drives Event Hubs (real EventHubConsumerClient + BlobCheckpointStore), timer
(NCRONTAB) and HTTP triggers. It never repeats the app's wiring. See docs/functions.md.
"""
