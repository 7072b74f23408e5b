"""Sender authentication on the VM: a key of this boot, bound to this VM by Azure's attested document.

The forwarder makes an Ed25519 key in memory (never written anywhere), asks IMDS for
`/metadata/attested/document?nonce=<nonce of the key>` through the forwarder's IMDS client (no
proxy, inside the VM's 5 requests/s budget, retried like every IMDS call), and signs each envelope's
exact body bytes with it. What travels with each event (application properties) and what central
checks: schemas/authn.py and central/intake/authn.py; why: docs/security.md ("Sender authentication").

Freshness: an attested document lives ~6 h on Azure. Halfway through (and never more often than
once a minute) a new key is made and attested; the old one keeps signing until the new document
arrives, so an IMDS hiccup stops nothing while the old document is valid. A new nonce per key also
side-steps IMDS's cache ("a previously cached nonce value may be returned"): an answer that does not
carry the nonce asked for is not used, and asked for again later.

Size: the attested document (~3 KB of base64) rides on the first event of every send and then at
most every `attach_every` seconds (0: on every event); the others carry the key id and a 64-byte
signature (~130 bytes). Central needs the verified key in its shared store to accept those.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from schemas import authn as wire

from . import logs
from .imds import ImdsClient, ImdsError, ImdsRejected

log = logs.get("attestation")

ATTESTED_PATH = "/metadata/attested/document"
ATTESTED_API_VERSION = "2021-02-01"
MOVE_RETRY_SECONDS = 60.0  # a document naming another subscription than the events: renewed at most so often
MIN_REFRESH_SECONDS = 60.0
EXPIRY_MARGIN_SECONDS = 120.0     # stop signing with a document this close to its expiry
LIFETIME_IF_UNREADABLE = 3600.0   # when the document's expiresOn cannot be read on the VM
# "04/19/22 07:27:21 -0000" (month/day/2-digit year): read with a pattern, not strptime, whose module
# (_strptime: calendar, locale, its regex cache) would stay loaded for good (about +0.6 MiB idle, issue 49).
_EXPIRES_ON = re.compile(rb'"expiresOn"\s*:\s*"(\d\d)/(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d) ([+-])(\d\d)(\d\d)"')
_SUBSCRIPTION = re.compile(rb'"subscriptionId"\s*:\s*"([^"]{0,64})"')


class AttestationError(Exception):
    """No usable attested key: IMDS did not answer, refused, or answered for another nonce.

    What to do: nothing at once (the sink keeps the envelopes and retries). If it persists, check
    that IMDS answers /metadata/attested/document on this VM (`se-forwarder check`)."""


@dataclass
class _Key:
    private: Any           # forwarder.ed25519.SigningKey (libsodium's Ed25519, through PyNaCl's binding)
    public: bytes
    kid: str
    attestation: str       # the document's base64 PKCS#7, as IMDS sent it
    expires_at: float
    refresh_at: float
    subscription: str = ""  # the one the document names ('' for documents that name none)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of `data` (RFC 8032; what central verifies with cryptography)."""
        return self.private.sign(data)


class Attestor:
    """`begin()` before each send (may call IMDS), then `sign(body)` per event (CPU only)."""

    def __init__(self, client: ImdsClient, attach_every: float = 0.0,
                 clock: Callable[[], float] = time.time, api_version: str = ATTESTED_API_VERSION) -> None:
        self.client = client
        self.attach_every = attach_every
        self.clock = clock
        self.api_version = api_version
        self.digit_nonce = False  # set when IMDS refuses the 32-character nonce (then central must allow it)
        self._key: Optional[_Key] = None
        self._next_try = 0.0
        self._next_move_try = 0.0
        self._failures = 0
        self._attach_next = True
        self._attached_at = float("-inf")
        self._lock = threading.Lock()
        self.refreshes = 0

    # ---- per send --------------------------------------------------------------------------------

    def begin(self, subscription: str = "") -> None:
        """Make sure a key with a current document exists (refreshing when due); the next signed
        event carries the document. `subscription`: the one the events to sign claim (their resourceId's):
        a document naming another (the VM was moved) is renewed now, since central refuses such events.
        Raises AttestationError when there is no usable key."""
        now = self.clock()
        key = self._key
        moved = (key is not None and bool(key.subscription) and bool(subscription)
                 and key.subscription.lower() != subscription.lower() and now >= self._next_move_try)
        if (key is None or moved or now >= key.refresh_at) and now >= self._next_try:
            if moved:  # at most once a minute: IMDS may still name the old subscription for a while
                self._next_move_try = now + MOVE_RETRY_SECONDS
            try:
                self._install(self._attest(now))
            except AttestationError as exc:
                self._failures += 1
                self._next_try = now + min(60.0, 2.0 ** self._failures)
                log.warning("attested document not renewed; %s", exc)
        key = self._key
        if key is None or now >= key.expires_at - EXPIRY_MARGIN_SECONDS:
            raise AttestationError("no current attested document for this VM yet; envelopes stay in the "
                                   "outbox until IMDS gives one")
        self._attach_next = True

    def sign(self, body: bytes) -> Dict[str, str]:
        """The application properties that authenticate `body` (its exact bytes)."""
        key = self._key
        if key is None:
            raise AttestationError("sign() before begin(): no key")
        props = {wire.PROP_VERSION: wire.VERSION, wire.PROP_KID: key.kid,
                 wire.PROP_SIGNATURE: wire.b64url(key.sign(wire.SIGNING_PREFIX + body))}
        now = self.clock()
        if self._attach_next or self.attach_every <= 0 or now - self._attached_at >= self.attach_every:
            props[wire.PROP_PUBLIC_KEY] = wire.b64url(key.public)
            props[wire.PROP_ATTESTATION] = key.attestation
            self._attach_next = False
            self._attached_at = now
        return props

    @property
    def kid(self) -> Optional[str]:
        return self._key.kid if self._key else None

    # ---- attesting -------------------------------------------------------------------------------

    def _install(self, key: _Key) -> None:
        with self._lock:
            self._key = key
            self._failures = 0
            self.refreshes += 1
        log.info("attested key in use", extra=logs.fields(kid=key.kid, expiresAt=key.expires_at))

    def _attest(self, now: float) -> _Key:
        # libsodium through PyNaCl's binding, not cryptography: +0.7 MiB of RSS imported alone
        # (forwarder/ed25519.py), cryptography's Ed25519 its whole Rust/OpenSSL binding (+6.5 MiB;
        # docs/forwarder.md, "Footprint"). The same Ed25519 (RFC 8032): central verifies with cryptography.
        from .ed25519 import SigningKey

        private = SigningKey.generate()
        public = private.public
        nonce = wire.digit_nonce_for(public) if self.digit_nonce else wire.nonce_for(public)
        try:
            der = self._document(nonce)
        except ImdsRejected as exc:
            if exc.status != 400 or self.digit_nonce:
                raise AttestationError(str(exc)) from exc
            # Microsoft's article documents "a 10-digit string"; the REST spec up to 32 alphanumerics.
            log.warning("IMDS refused a 32-character nonce; falling back to the 10-digit form, which "
                        "central accepts only with allow_digit_nonce (docs/security.md)")
            self.digit_nonce = True
            nonce = wire.digit_nonce_for(public)
            der = self._document(nonce)
        if nonce.encode("ascii") not in der:
            raise AttestationError("IMDS answered an attested document for another nonce (its cache); "
                                   "asking again later")
        lifetime = _lifetime(der, now)
        named = _SUBSCRIPTION.search(der)
        return _Key(private, public, nonce, base64.b64encode(der).decode("ascii"),
                    expires_at=now + lifetime,
                    refresh_at=now + max(MIN_REFRESH_SECONDS, lifetime / 2),
                    subscription=named.group(1).decode("ascii", "replace") if named else "")

    def _document(self, nonce: str) -> bytes:
        """The DER of the attested document for `nonce`. Raises AttestationError / ImdsRejected."""
        try:
            response = self.client.request("GET", f"{ATTESTED_PATH}?nonce={nonce}", self.api_version)
        except ImdsRejected:
            raise
        except ImdsError as exc:
            raise AttestationError(str(exc)) from exc
        try:
            answer = json.loads(response.text)
            if answer.get("encoding") != "pkcs7":
                raise ValueError(f"encoding {answer.get('encoding')!r}, want 'pkcs7'")
            return base64.b64decode(str(answer["signature"]), validate=True)
        except (ValueError, KeyError, AttributeError, binascii.Error) as exc:
            raise AttestationError(f"IMDS attested document is not usable: {exc}") from exc


def _lifetime(der: bytes, now: float) -> float:
    """Seconds until the document's expiresOn, read from the signed JSON inside the DER (the VM only
    plans its refresh with it; central verifies the real thing)."""
    found = _EXPIRES_ON.search(der)
    if found:
        month, day, year, hour, minute, second, sign, off_h, off_m = (g.decode() for g in found.groups())
        offset = dt.timedelta(hours=int(off_h), minutes=int(off_m)) * (-1 if sign == "-" else 1)
        try:
            expires = dt.datetime(2000 + int(year), int(month), int(day), int(hour), int(minute), int(second),
                                  tzinfo=dt.timezone(offset))
            return max(0.0, expires.timestamp() - now)
        except ValueError:  # 13/45/22 ...: a date that does not exist
            pass
    return LIFETIME_IF_UNREADABLE


def for_sink(config: Any, limiter: Any) -> Optional[Attestor]:
    """The attestor the Event Hubs sink signs with when `authenticate` is on (docs/security.md)."""
    if not getattr(config, "authenticate", False):
        return None
    client = ImdsClient(config.imds_url, limiter=limiter, retry_seconds=10.0)
    return Attestor(client, attach_every=config.attestation_attach_every)
