"""IMDS is never reached through a proxy, redirects are never followed, and a huge answer is never
read whole, in process (the client) and as the CLI runs (`se-forwarder check` as a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Iterator

import pytest

from forwarder.imds import MAX_BODY_BYTES, ImdsClient, ImdsRejected, ImdsTooLarge
from sandbox import processes

from . import localhttp

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture
def proxy() -> Iterator[Any]:
    """A proxy on loopback that records every request and answers 502."""
    with localhttp.serve(lambda h: localhttp.reply(h, 502, b"recorded by the test proxy")) as server:
        yield server


def imds_requests(server: processes.Server) -> list:
    import requests

    session = requests.Session()
    session.trust_env = False  # the admin API directly, whatever proxy the test set
    url = f"http://{processes.LOOPBACK}:{server.port}/admin/requests?vm=vm0"
    return session.get(url, timeout=10).json()


def test_check_cli_ignores_every_proxy_variable(imds_server: processes.Server, proxy: Any,
                                                tmp_path: Path) -> None:
    env = processes.minimal_env(**{name: localhttp.url(proxy) for name in PROXY_VARS},
                                NO_PROXY="example.invalid", no_proxy="example.invalid")
    (tmp_path / "config.json").write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "forwarder", "check", "--json", "--config", str(tmp_path / "config.json"),
         "--imds-url", f"http://{processes.LOOPBACK}:{imds_server.port}/vms/vm0",
         "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=processes.REPO, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["document"]["valid"] is True
    assert proxy.seen == [], "IMDS traffic went through the proxy"
    paths = [r["path"] for r in imds_requests(imds_server)]
    assert any("scheduledevents" in p for p in paths) and any("compute" in p for p in paths)
    # Control: the same environment does send an ordinary requests call to the proxy.
    control = "import requests; requests.get('http://control.invalid/', timeout=5)"
    subprocess.run([sys.executable, "-c", control],
                   capture_output=True, timeout=30, env=env, cwd=processes.REPO)
    assert proxy.seen and "control.invalid" in proxy.seen[0], proxy.seen


def test_client_ignores_proxy_variables_with_no_proxy_set(
        imds_server: processes.Server, proxy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, with NO_PROXY naming other hosts only (tests/forwarder covers it unset)."""
    for name in PROXY_VARS:
        monkeypatch.setenv(name, localhttp.url(proxy))
    monkeypatch.setenv("NO_PROXY", "example.invalid,.corp.invalid")
    monkeypatch.setenv("no_proxy", "example.invalid,.corp.invalid")
    client = ImdsClient(f"http://{processes.LOOPBACK}:{imds_server.port}/vms/vm0")
    try:
        assert client.get_compute()["name"] == "vm0"
        assert client.get_scheduled_events().status == 200
    finally:
        client.close()
    assert proxy.seen == []
    assert len(imds_requests(imds_server)) >= 2


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_redirects_from_imds_are_never_followed(status: int) -> None:
    with localhttp.serve(lambda h: localhttp.reply(h, status, b"", {"Location": "/elsewhere"})) as server:
        client = ImdsClient(localhttp.url(server), retry_seconds=1.0)
        with pytest.raises(ImdsRejected) as err:
            client.get_scheduled_events()
        client.close()
    assert err.value.status == status and "redirect" in str(err.value)
    assert len(server.seen) == 1 and not any("/elsewhere" in s for s in server.seen)


@pytest.mark.parametrize("declare_length", [True, False])
def test_a_50_mb_imds_answer_is_refused_without_reading_it(declare_length: bool) -> None:
    total = 50 * 1024 * 1024
    with localhttp.serve(lambda h: localhttp.stream(h, total, declare_length)) as server:
        client = ImdsClient(localhttp.url(server), retry_seconds=1.0)
        tracemalloc.start()
        try:
            with pytest.raises(ImdsTooLarge) as err:
                client.get_scheduled_events()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            client.close()
    assert "larger than" in str(err.value) and str(MAX_BODY_BYTES) in str(err.value)
    assert peak < 8 * MAX_BODY_BYTES, f"peak {peak} bytes while refusing a {total}-byte answer"
    assert len(server.seen) == 1  # refused, not retried


def test_a_large_but_legal_document_is_still_read() -> None:
    events = [{"EventId": f"E{i}", "EventStatus": "Scheduled", "EventType": "Freeze",
               "ResourceType": "VirtualMachine", "Resources": [f"vmss_{j}" for j in range(100)],
               "NotBefore": ""} for i in range(20)]
    body = json.dumps({"DocumentIncarnation": 1, "Events": events}).encode()
    assert 10_000 < len(body) < MAX_BODY_BYTES
    json_type = {"Content-Type": "application/json"}
    with localhttp.serve(lambda h: localhttp.reply(h, 200, body, json_type)) as server:
        client = ImdsClient(localhttp.url(server))
        assert client.get_scheduled_events().json()["Events"] == events
        client.close()
