"""`se-attest`: check one IMDS attested document against the deployment's trust, as central would.

    se-attest FILE|- [--at ISO-8601] [--roots PEM] [--domains D,...] [--offline]

FILE holds what IMDS answers (`{"encoding":"pkcs7","signature":"<base64>"}`) or the bare base64; "-"
reads stdin. The trust is central's default (certifi's DigiCert Global Root G2 and Microsoft RSA Root
CA 2017, the shipped Microsoft intermediates, AIA fetches from Microsoft's and DigiCert's hosts) plus
--roots (a PEM file: what AUTHN_TRUST_PEM holds). Without --domains: metadata.azure.com and
metadata.azure.us. --at: the time to check at (default now); the document must be inside its
timeStamp window then, as central checks an envelope at the time it received it.

Prints, on success, the vmId, the subscription, the document's validity and the chain with where each
certificate came from (document, shipped, certifi, operator, fetched); otherwise the one reason it
fails with its class (malformed | forgery | trust | time). The critical alert of a trust failure
names this command. Exit codes (as se-policy): 0 verified, 2 refused, 3 bad usage or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, NoReturn, Optional, Sequence, TextIO

from central.cli.closed_pipe import survives_closed_pipe
from central.intake import aia, attested, trust_store
from central.intake.chain import name_of
from central.intake.trust_store import utc_second

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 2, 3


class UsageError(Exception):
    """Bad arguments or unreadable input: one line, exit 3."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own exit code 2 would read as "refused"
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="se-attest", description="Check one IMDS attested document against central's trust.")
    p.add_argument("file", help='the document (IMDS JSON or bare base64); "-" reads stdin')
    p.add_argument("--at", help="the time to check at, ISO-8601 (default: now)")
    p.add_argument("--roots", help="a PEM file added to the trust (what AUTHN_TRUST_PEM holds)")
    p.add_argument("--domains", help="comma-separated metadata domains (default: metadata.azure.com,"
                   "metadata.azure.us)")
    p.add_argument("--offline", action="store_true", help="never fetch an issuer through AIA")
    return p


def read_document(text: str) -> str:
    text = text.strip()
    if text.startswith("{"):
        try:
            found = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"the document is not JSON: {exc}") from None
        if not isinstance(found, dict) or not isinstance(found.get("signature"), str):
            raise UsageError('the JSON has no "signature" string (IMDS answers {"encoding":"pkcs7",'
                             '"signature":"..."})')
        return found["signature"].strip()
    if not text:
        raise UsageError("the document is empty")
    return "".join(text.split())


def _at(value: Optional[str]) -> datetime:
    if not value:
        return datetime.now().astimezone()
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--at is not an ISO-8601 time: {value!r}") from None
    if when.tzinfo is None:
        raise UsageError(f"--at needs a time zone (e.g. {value}Z)")
    return when


def run(args: argparse.Namespace, stdin: TextIO, out: TextIO) -> int:
    try:
        text = stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        pem = Path(args.roots).read_text(encoding="ascii") if args.roots else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {exc}") from None
    signature, when = read_document(text), _at(args.at)
    try:
        trust = trust_store.default_trust(pem, args.domains or attested.DEFAULT_DOMAINS,
                                          fetch=None if args.offline else aia.AiaFetcher())
    except attested.TrustConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        doc = attested.check_document(signature, trust, when)
        attested.check_window(doc.created, doc.expires, doc.valid_from, doc.valid_until, when,
                              trust.skew_seconds)
    except attested.Fail as fail:
        print(f"refused ({fail.kind}): {fail.detail}", file=out)
        if fail.issuer:
            print(f"issuer not chained: {fail.issuer} (docs/security.md, 'When Azure changes its CA')",
                  file=out)
        print_expiry(trust_store.expiry(trust, when), out)
        return EXIT_REFUSED
    print(f"verified at {utc_second(when)} (domains {', '.join(trust.domains)})", file=out)
    print(f"vmId:         {doc.claims.get('vmId')}", file=out)
    print(f"subscription: {doc.claims.get('subscriptionId', '(none in this document)')}", file=out)
    print(f"document:     {utc_second(doc.created)} .. {utc_second(doc.expires)}; chain valid "
          f"{utc_second(doc.valid_from)} .. {utc_second(doc.valid_until)}", file=out)
    print("chain:", file=out)
    for cert, source in zip(doc.chain, doc.sources):
        print(f"  {source:<8} {name_of(cert.subject)}  [{utc_second(cert.not_valid_before_utc)} .. "
              f"{utc_second(cert.not_valid_after_utc)}]", file=out)
    print_expiry(trust_store.expiry(trust, when), out)
    return EXIT_OK


def print_expiry(found: Dict[str, Any], out: TextIO) -> None:
    """The trust's earliest expiry as of the check's time, and a WARNING within 180 days of it."""
    if found.get("earliest"):
        print(f"trust: earliest expiry {found['earliest']} ({found['subject']}, {found['source']}), "
              f"{found['daysLeft']} days after the check's time", file=out)
    if found.get("warning"):
        print(f"WARNING: {found['warning']}", file=out)
    for cert in found.get("expired") or []:
        print(f"expired in the trust: {cert['subject']} ({cert['source']}) ended {cert['notAfter']}",
              file=out)


@survives_closed_pipe
def main(argv: Optional[Sequence[str]] = None, out: Optional[TextIO] = None,
         stdin: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    try:
        return run(parser().parse_args(argv), stdin or sys.stdin, out)
    except UsageError as exc:
        print(f"se-attest: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
