"""The approval queue over the Queue service's REST API (forwarder/approvals/queue_rest.py) against Azurite
with `--oauth basic` over HTTPS, tokens from the IMDS simulator: get, peek, delete, put on the wire as Azure
documents them; a missing queue; an expired token refused, forgotten, replaced; the reader's Retry-After."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest
from azure.storage.queue import QueueClient

from bench.tlsrelay import make_certificate
from forwarder.approvals import queue as queue_mod
from forwarder.approvals.queue_rest import QueueNotFound, QueueRestClient, parse_messages
from forwarder.credential import ManagedIdentityCredential
from forwarder.ratelimit import RateLimiter
from sandbox import processes
from tests.forwarder.helpers import ExpiringCredential, imds_url


@pytest.fixture(scope="module")
def azurite_oauth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[processes.Server, Path]]:
    work = tmp_path_factory.mktemp("azurite-oauth")
    cert, key = make_certificate(work)
    server = processes.start_azurite(log_dir=work, oauth_tls=(cert, key))
    yield server, cert
    server.stop()


def account_url(server: processes.Server) -> str:
    return f"https://{processes.LOOPBACK}:{server.ports['queue']}/{processes.AZURITE_ACCOUNT}"


def sdk_queue(server: processes.Server, cert: Path, name: str) -> QueueClient:
    """Central's side (the SDK, shared key over HTTPS): creates the queue and puts the approvals."""
    conn = (f"DefaultEndpointsProtocol=https;AccountName={processes.AZURITE_ACCOUNT};"
            f"AccountKey={processes.AZURITE_KEY};QueueEndpoint={account_url(server)};")
    return QueueClient.from_connection_string(conn, name, connection_verify=str(cert))


def rest_queue(server: processes.Server, cert: Path, name: str, credential: Any) -> QueueRestClient:
    return QueueRestClient(account_url(server), name, credential,
                           context=ssl.create_default_context(cafile=str(cert)))


def test_receive_peek_delete_and_put_over_rest(azurite_oauth: Tuple[processes.Server, Path],
                                               imds_server: processes.Server) -> None:
    server, cert = azurite_oauth
    central = sdk_queue(server, cert, "vm-rest-a")
    central.create_queue()
    text = '{"eventId": "E1", "note": "<&> \\u00e9"}'
    central.send_message(text)
    credential = ManagedIdentityCredential("", RateLimiter(), authority=imds_url(imds_server))
    client = rest_queue(server, cert, "vm-rest-a", credential)
    (peeked,) = client.peek_messages(max_messages=1)
    assert peeked.content == text and peeked.dequeue_count == 0 and not peeked.pop_receipt
    (got,) = client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=30)
    assert got.content == text and got.dequeue_count == 1 and got.pop_receipt
    assert client.receive_messages(visibility_timeout=30) == []  # invisible while being handled
    client.delete_message(got.id, got.pop_receipt)
    with pytest.raises(QueueNotFound):  # deleted: gone (the reader treats it as "already gone")
        client.delete_message(got.id, got.pop_receipt)
    client.send_message(text)  # the poison path: put, read back unchanged by the SDK
    assert [m.content for m in central.peek_messages(max_messages=5)] == [text]
    assert client.requests == 6 and credential.requests == 1  # one token for every call
    client.close()
    central.delete_queue()


def test_a_missing_queue_is_queue_not_found(azurite_oauth: Tuple[processes.Server, Path],
                                            imds_server: processes.Server) -> None:
    server, cert = azurite_oauth
    credential = ManagedIdentityCredential("", RateLimiter(), authority=imds_url(imds_server))
    client = rest_queue(server, cert, "vm-rest-none", credential)
    with pytest.raises(QueueNotFound, match="QueueNotFound"):
        client.receive_messages(visibility_timeout=30)
    unavailable, missing = queue_mod.errors()
    assert QueueNotFound in missing and issubclass(QueueNotFound, unavailable)


def test_an_expired_token_is_refused_forgotten_and_replaced(
        azurite_oauth: Tuple[processes.Server, Path]) -> None:
    server, cert = azurite_oauth
    central = sdk_queue(server, cert, "vm-rest-exp")
    central.create_queue()
    credential = ExpiringCredential("https://storage.azure.com")
    client = rest_queue(server, cert, "vm-rest-exp", credential)
    with pytest.raises(queue_mod.QueueError, match="HTTP 403 AuthenticationFailed") as info:
        client.receive_messages(visibility_timeout=30)
    assert info.value.status == 403 and credential.forgotten == ["https://storage.azure.com/.default"]
    assert client.receive_messages(visibility_timeout=30) == []
    client.close()
    central.delete_queue()


def test_parse_messages_reads_the_documented_answer() -> None:
    xml = ("<?xml version=\"1.0\" encoding=\"utf-8\"?><QueueMessagesList><QueueMessage>"
           "<MessageId>id-1</MessageId><InsertionTime>Mon, 07 Dec 2026 16:00:00 GMT</InsertionTime>"
           "<ExpirationTime>Mon, 14 Dec 2026 16:00:00 GMT</ExpirationTime><PopReceipt>r1</PopReceipt>"
           "<TimeNextVisible>Mon, 07 Dec 2026 16:00:30 GMT</TimeNextVisible><DequeueCount>3</DequeueCount>"
           "<MessageText>{&quot;a&quot;: &lt;1&gt;}</MessageText></QueueMessage></QueueMessagesList>")
    (message,) = parse_messages(xml)
    assert (message.id, message.pop_receipt, message.dequeue_count) == ("id-1", "r1", 3)
    assert message.content == '{"a": <1>}'
    assert parse_messages("<QueueMessagesList />") == []


def test_the_reader_waits_out_a_throttled_queue() -> None:
    """429/503 from the queue (Retry-After: 7): the reader's next read is no sooner, and never later than
    its slow interval; without Retry-After it backs off as before (under a second at first)."""
    from forwarder.approvals.reader import ApprovalReader
    from forwarder.approvals.settings import ReaderSettings

    class Throttled:
        queue_name = "vm-throttled"

        def __init__(self, after: Any) -> None:
            self.after = after

        def receive_messages(self, **_: Any) -> List[Any]:
            raise queue_mod.QueueError("queue vm-throttled: HTTP 503 ServerBusy", 503, "ServerBusy",
                                       self.after)

    waits: List[float] = []
    for after in (7.0, 600.0, None):
        reader = ApprovalReader(Throttled(after), approver=None, ledger=None,  # type: ignore[arg-type]
                                publish=lambda result: None, settings=ReaderSettings())
        reader._scheduled = True  # an event naming this VM is Scheduled: the queue is read
        reader._sleep = waits.append  # type: ignore[method-assign]
        reader.step()
        assert reader.stats["errors"] == 1 and "ServerBusy" in str(reader.last_error)
    assert waits[0] >= 7.0 and waits[1] == ReaderSettings().slow_interval and waits[2] <= 1.0


def test_the_rest_client_loads_neither_html_nor_xml_sax() -> None:
    """html's HTML5 entity table (+0.7 MiB) and xml.sax's urllib.request (+1 MiB) for an escape that
    ElementTree, loaded anyway for the answers, does."""
    import subprocess
    import sys

    probe = ("import sys; from forwarder.approvals import queue_rest; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('html', 'xml') and m != 'xml'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=processes.REPO, check=True)
    assert done.stdout.strip() == "['xml.etree', 'xml.etree.ElementPath', 'xml.etree.ElementTree']"
