"""`make demo` (`python -m sandbox.demo`): the whole pipeline on this machine, one scenario, a timeline.

Modules: `fleet` (start/stop every process), `scenario` (the four scenes, evidence, checks),
`timeline` (the lines a person reads), `run` (one complete run, shared with tests/e2e), `__main__`.
docs/demo.md explains the output.
"""
