"""What the forwarder does not load, the metrics endpoint (opt-in, over HTTP), the example hooks, the
Event Hubs TLS context. The import checks run `python -m forwarder` in a fresh process."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Dict, List

import pytest

from forwarder import hooks
from forwarder.sinks.tls_trust import tls_context
from sandbox import processes

from .helpers import Forwarder, admin, imds_url, incarnations, wait_until

REPO = processes.REPO

# Print the modules a command loaded, from inside the process (after main() returns or on SIGTERM).
PROBE = """
import atexit, json, sys
loaded = lambda: sorted(k for k, v in sys.modules.items() if v is not None)  # None: blocked, not loaded
atexit.register(lambda: sys.stderr.write("MODULES " + json.dumps(loaded()) + "\\n"))
sys.argv = ["se-forwarder"] + sys.argv[1:]
from forwarder.cli import main
sys.exit(main())
"""


def modules_of(tmp_path: Path, *argv: str) -> List[str]:
    (tmp_path / "c.json").write_text("{}")
    done = subprocess.run([sys.executable, "-c", PROBE, *argv, "--config", str(tmp_path / "c.json")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("MODULES ")]
    return json.loads(line[len("MODULES "):])


def test_check_with_a_file_sink_loads_no_azure_sdk_no_requests_and_no_charset_detector(
        imds_server: processes.Server, tmp_path: Path) -> None:
    """IMDS is read with http.client (forwarder/imds_http.py): requests comes only with a token call."""
    loaded = modules_of(tmp_path, "check", "--imds-url", imds_url(imds_server),
                        "--state-dir", str(tmp_path / "s"))
    assert "http.client" in loaded and "forwarder.imds_http" in loaded
    heavy = [m for m in loaded if m.split(".")[0] in ("azure", "msal", "cryptography", "charset_normalizer",
                                                      "chardet", "aiohttp", "asyncio", "requests", "urllib3")]
    assert heavy == [], heavy


def test_an_idle_run_with_a_queue_loads_neither_the_queue_sdk_nor_the_approval_parts(
        imds_server: processes.Server, azurite: processes.Server, tmp_path: Path) -> None:
    sink = tmp_path / "out.jsonl"
    probe = tmp_path / "modules.py"
    probe.write_text(PROBE)
    fw = Forwarder(imds_url(imds_server), tmp_path / "state", sink,
                   env={"SE_FORWARDER_QUEUE_CONNECTION_STRING": azurite.extra["connection_string"]})
    fw._argv = [sys.executable, str(probe), *fw._argv[3:]]  # the same command line, through the probe
    fw.start()
    try:
        wait_until(lambda: incarnations(sink) == [1], what="incarnation 1")
    finally:
        assert fw.terminate() == 0
    (line,) = [x["msg"] for x in fw.logs() if str(x.get("msg", "")).startswith("MODULES ")]
    loaded = json.loads(line[len("MODULES "):])
    unused = ("azure.storage", "forwarder.approvals.reader", "forwarder.approvals.approver",
              "forwarder.hooks", "forwarder.fastpath", "forwarder.recovery", "charset_normalizer",
              "forwarder.metrics", "http.server", "prometheus_client", "wsgiref",
              # incarnation 1 was checked against the schema in a child process (forwarder.validation)
              "jsonschema", "referencing", "rpds", "attrs", "rfc3339_validator")
    assert not [m for m in loaded if m.startswith(unused)]


# ---- metrics -----------------------------------------------------------------------------------------

def _scrape(port: int) -> Dict[str, float]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        text = resp.read().decode()
    from prometheus_client.parser import text_string_to_metric_families

    assert len(list(text_string_to_metric_families(text))) >= 15  # a standard parser reads every family
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_endpoint_on_loopback(imds_server: processes.Server, tmp_path: Path) -> None:
    port = processes.free_port()
    sink = tmp_path / "out.jsonl"
    fw = Forwarder(imds_url(imds_server), tmp_path / "state", sink,
                   extra=["--metrics-port", str(port)]).start()
    try:
        wait_until(lambda: incarnations(sink) == [1], what="incarnation 1")
        admin(imds_server, "POST", "events", {"eventType": "Reboot", "noticeSeconds": 900})
        wait_until(lambda: incarnations(sink) == [1, 2], what="incarnation 2")
        def settled() -> Dict[str, float]:
            v = _scrape(port)
            quiet = v['se_forwarder_polls_total{result="not_modified"}'] >= 1
            return v if quiet and v["se_forwarder_outbox_backlog"] == 0 else {}

        values = wait_until(settled, what="a drained outbox and an unchanged poll")
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://127.0.0.1:{port}/other", timeout=10)
        assert missing.value.code == 404
    finally:
        assert fw.terminate() == 0
    assert values["se_forwarder_last_incarnation"] == 2 and values["se_forwarder_scheduled_events"] == 1
    assert values["se_forwarder_imds_requests_total"] >= 3
    assert values['se_forwarder_polls_total{result="parsed"}'] >= 2
    assert values['se_forwarder_polls_total{result="not_modified"}'] >= 1
    assert values["se_forwarder_outbox_last_send_timestamp_seconds"] > 0
    assert any(k.startswith("se_forwarder_build_info{") and "version=" in k for k in values)
    labels = {k.split("{", 1)[1] for k in values if "{" in k}
    assert all("vm" not in label and "event" not in label for label in labels)  # bounded cardinality


def test_metrics_port_taken_is_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        (tmp_path / "c.json").write_text("{}")
        done = subprocess.run([sys.executable, "-m", "forwarder", "run", "--config", str(tmp_path / "c.json"),
                               "--state-dir", str(tmp_path / "s"), "--metrics-port", str(port),
                               "--imds-url", "http://127.0.0.1:9"], capture_output=True, text=True,
                              timeout=60, cwd=REPO)
    assert done.returncode == 2 and f"metrics_port {port}" in done.stderr and "Traceback" not in done.stderr


# ---- example hooks -------------------------------------------------------------------------------

@pytest.mark.parametrize("windows", [False, True])
def test_example_hooks_are_installed_and_never_run(tmp_path: Path, windows: bool) -> None:
    written = hooks.install_examples(str(tmp_path), windows=windows)
    suffix = ".cmd.example" if windows else ".sh.example"
    assert sorted(p.name for p in written) == sorted([f"50-drain{suffix}", f"50-undrain{suffix}"])
    assert {p.parent.name for p in written} == {"pre-approve.d", "post-event.d"}
    for path in written:
        text = path.read_text()
        assert "NOT RUN" in text and "SE_EVENT_ID" in text and "without the .example suffix" in text
        if not windows:
            os.chmod(path, 0o755)  # noqa: S103 - even executable, an example is skipped
    assert hooks.install_examples(str(tmp_path), windows=windows) == []  # an existing file is left alone
    settings = hooks.HookSettings(hook_dir=str(tmp_path), timeout_seconds=5)
    env = hooks.event_environment({"EventId": "E"}, "vm0")
    for phase in hooks.PHASES:
        run = hooks.run_phase(phase, env, settings)
        assert run.ran == 0 and run.results == []


@pytest.mark.skipif(os.name != "posix" or not Path("/bin/sh").exists(), reason="POSIX shell")
def test_the_linux_examples_work_once_enabled(tmp_path: Path) -> None:
    for path in hooks.install_examples(str(tmp_path), windows=False):
        enabled = path.with_name(path.name.replace(".sh.example", ""))
        enabled.write_text(path.read_text().replace("logger -t", "echo"))
        os.chmod(enabled, 0o755)  # noqa: S103 - how an admin enables a hook
    settings = hooks.HookSettings(hook_dir=str(tmp_path), timeout_seconds=10)
    env = hooks.event_environment({"EventId": "E1", "EventType": "Reboot", "Resources": ["vm0"]}, "vm0",
                                  extra={"SE_DECIDED_BY": "policy:x", "SE_EVENT_END": "completed"})
    for phase in hooks.PHASES:
        run = hooks.run_phase(phase, env, settings)
        assert run.ok and run.ran == 1, run.summary()
        assert "E1" in run.results[0].output


# ---- Event Hubs TLS trust ------------------------------------------------------------------------

def test_tls_context_uses_a_hashed_ca_directory_lazily(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    assert tls_context() is None  # no hashed certificates there: the SDK's default (certifi)
    (tmp_path / "0123abcd.0").write_text("not loaded until a chain needs it")
    context = tls_context()
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.cert_store_stats()["x509_ca"] == 0  # nothing loaded up front


