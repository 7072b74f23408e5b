"""`se-attest`: one attested document against central's default trust, offline, with exit codes
0 verified / 2 refused / 3 bad usage, and the one reason with its class."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import pytest

from central.cli import se_attest
from central.intake import trust_store
from tests.security import attested_docs as docs

G2 = docs.DOCS / "tc-2026-07-28-eastus-g2ocsp02.json"


def run(*argv: str, stdin: str = "") -> tuple:
    out = io.StringIO()
    code = se_attest.main([*argv, "--offline"], out=out, stdin=io.StringIO(stdin))
    return code, out.getvalue()


def test_a_g2_document_prints_vm_subscription_validity_and_chain_sources() -> None:
    code, out = run(str(G2), "--at", "2026-07-28T13:30:00Z")
    assert code == 0, out
    assert "vmId:         b1310a36-d400-46f6-82cb-6217df846586" in out
    assert "subscription: 8a205152-b25a-417f-a676-80465535a6c9" in out
    assert "document:     2026-07-28T13:24:00Z .. 2026-07-28T19:24:00Z" in out
    chain = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert chain == ["document", "shipped", "shipped", "certifi"]


def test_stdin_and_bare_base64_read_the_same() -> None:
    signature = json.loads(G2.read_text())["signature"]
    assert run("-", "--at", "2026-07-28T13:30:00Z", stdin=signature)[0] == 0


@pytest.mark.parametrize("argv, kind", [
    ([str(G2), "--at", "2026-11-12T00:00:00Z"], "time"),
    ([str(G2), "--at", "2026-07-28T13:30:00Z", "--domains", "metadata.azure.us"], "forgery"),
    ([str(docs.DOCS / "tc-2019-12-13-westus-mitlsca4.json"), "--at", "2019-12-13T00:40:00Z"], "trust"),
    ([str(docs.DOCS / "negative" / "g2-2026-07-28-vmid-changed.json"), "--at", "2026-07-28T13:30:00Z"],
     "forgery"),
])
def test_a_refusal_prints_its_one_reason_and_class(argv: list, kind: str) -> None:
    code, out = run(*argv)
    assert code == 2 and out.startswith(f"refused ({kind}): "), out
    assert ("issuer not chained: Microsoft IT TLS CA 4" in out) == (kind == "trust")


def test_the_document_window_counts_too() -> None:
    """Inside the signer's validity but hours after the document's expiresOn: a time refusal."""
    code, out = run(str(G2), "--at", "2026-07-29T13:30:00Z")
    assert code == 2 and out.startswith("refused (time): the attested document"), out


def test_an_operator_root_verifies_a_baltimore_chain(tmp_path: Path) -> None:
    roots = docs.ATTESTED / "certs"
    pem = tmp_path / "ops.pem"
    pem.write_text((roots / "roots" / "baltimore_cybertrust_root.pem").read_text()
                   + (roots / "intermediates" / "microsoft_rsa_tls_ca_01_by_baltimore.pem").read_text())
    code, out = run(str(docs.DOCS / "coder-2022-04-19-southcentralus-mrsatlsca01.json"), "--at",
                    "2022-04-19T01:30:00Z", "--roots", str(pem))
    assert code == 0, out
    assert [line.split()[0] for line in out.splitlines() if line.startswith("  ")] == \
        ["document", "operator", "operator"]


@pytest.mark.parametrize("argv", [["/no/such/file"], [str(G2), "--at", "yesterday"],
                                  [str(G2), "--at", "2026-07-28T13:30:00"], []])
def test_bad_usage_is_exit_3(argv: list, capsys: pytest.CaptureFixture) -> None:
    assert se_attest.main(argv, out=io.StringIO()) == 3
    assert capsys.readouterr().err.startswith("se-attest: ")


def test_the_trusts_earliest_expiry_is_shown_and_warned_of_within_180_days_of_the_checks_time() -> None:
    """Issue 45, item 4, on any date: the warning is judged at --at, so the test moves that clock."""
    first = min(c.not_valid_after_utc for c in trust_store.shipped())
    far = (first - dt.timedelta(days=181)).strftime("%Y-%m-%dT%H:%M:%SZ")
    code, out = run(str(G2), "--at", far)
    assert code == 2 and out.startswith("refused (time)"), out  # long after the document: refused, still told
    shown = f"trust: earliest expiry {first.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    assert shown in out and "WARNING" not in out, out
    near = (first - dt.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    code, out = run(str(G2), "--at", near)
    assert "WARNING: Microsoft Azure RSA TLS Issuing CA 03 (shipped) expires" in out, out
    assert "in 30 days" in out, out
    code, out = run(str(G2), "--at", "2026-07-28T13:30:00Z")  # verified, and the same line follows the chain
    assert code == 0 and out.splitlines()[-1].startswith("trust: earliest expiry"), out
