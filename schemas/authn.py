"""Sender authentication on the wire: what the forwarder attaches to each Event Hubs event and what
central checks (docs/security.md, "Sender authentication"). Shared by both sides, like the schemas.

Each event carries, in its AMQP application properties (never in the body, so the signature covers
the exact body bytes central receives):

- `se-auth`     the scheme version, `"1"`;
- `se-auth-kid` the key id: the 32-character nonce the key was attested with (see `nonce_for`);
- `se-auth-sig` Ed25519 over `SIGNING_PREFIX + body`, base64url without padding;
- `se-auth-pub` the raw 32-byte Ed25519 public key, base64url (with `se-auth-att` only);
- `se-auth-att` the IMDS attested document's `signature` field (base64 PKCS#7), sent with the first
  event of a key and then at most every `attach_every` seconds (0: on every event).

The binding: the forwarder asks IMDS for `/metadata/attested/document?nonce=<nonce_for(pub)>`; Azure
signs a document naming this VM's vmId and that nonce, so the key belongs to a process on that VM. The
document also names the VM's subscription: central holds the one an envelope's `vm.resourceId` names to it
(`resource_id_subscription`), and the forwarder renews its document when they differ (the VM was moved).
"""

from __future__ import annotations

import base64
import hashlib

VERSION = "1"
PROP_VERSION = "se-auth"
PROP_KID = "se-auth-kid"
PROP_SIGNATURE = "se-auth-sig"
PROP_PUBLIC_KEY = "se-auth-pub"
PROP_ATTESTATION = "se-auth-att"
PROPERTIES = (PROP_VERSION, PROP_KID, PROP_SIGNATURE, PROP_PUBLIC_KEY, PROP_ATTESTATION)

SIGNING_PREFIX = b"se-envelope-v1\n"  # domain separation: this key signs envelopes and nothing else
_NONCE_CONTEXT = b"se-forwarder-attestation-v1\n"
NONCE_LENGTH = 32  # the IMDS REST spec: "a string of up to 32 random alphanumeric characters"
DIGIT_NONCE_LENGTH = 10  # Microsoft's IMDS article: "a 10-digit string" (the weak fallback)


def nonce_for(public_key: bytes) -> str:
    """The nonce that binds `public_key` (raw Ed25519, 32 bytes): 32 lowercase base32 characters
    (a-z, 2-7; all alphanumeric) of SHA-256 over a context string and the key: 160 bits."""
    digest = hashlib.sha256(_NONCE_CONTEXT + public_key).digest()
    return base64.b32encode(digest[:20]).decode("ascii").lower()


def digit_nonce_for(public_key: bytes) -> str:
    """The 10-digit form, for an IMDS that refuses the 32-character one: only ~33 bits, so central
    accepts it only when told to (docs/security.md says why that is weak)."""
    digest = hashlib.sha256(_NONCE_CONTEXT + public_key).digest()
    return f"{int.from_bytes(digest[:8], 'big') % 10**DIGIT_NONCE_LENGTH:0{DIGIT_NONCE_LENGTH}d}"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def from_b64url(text: str) -> bytes:
    """Decode base64url with or without padding; raises ValueError on anything else."""
    if not isinstance(text, str) or not text.isascii():
        raise ValueError("not base64url text")
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def resource_id_subscription(resource_id: object) -> str:
    """The subscription an ARM resource id names when it starts `/subscriptions/<id>/` (as IMDS gives a VM's
    resourceId), else '': the one reading both sides agree on (central's policy, ARM owner and scopes all
    read an id of this shape the same way)."""
    parts = resource_id.split("/") if isinstance(resource_id, str) else []
    return parts[2] if len(parts) > 3 and parts[0] == "" and parts[1].lower() == "subscriptions" else ""
