"""forwarder/ed25519.py, the one module on PyNaCl's private binding (nacl._sodium): it must give the keys
and signatures PyNaCl's public nacl.signing gives, byte for byte, and what central verifies with
cryptography. Fails when PyNaCl changes under it (a name gone, a call changed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nacl.signing import SigningKey as NaclSigningKey

from forwarder.ed25519 import SigningKey
from sandbox import processes

# RFC 8032 section 7.1, TEST 2: a published seed, public key, message and signature (public test data).
RFC_SEED = bytes.fromhex(
    "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb")  # pragma: allowlist secret
RFC_PUBLIC = bytes.fromhex(
    "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c")  # pragma: allowlist secret
RFC_MESSAGE = bytes.fromhex("72")
RFC_SIGNATURE = bytes.fromhex(
    "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"  # pragma: allowlist secret
    "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00")  # pragma: allowlist secret


def test_the_rfc_8032_vector() -> None:
    key = SigningKey(RFC_SEED)
    assert key.public == RFC_PUBLIC
    assert key.sign(RFC_MESSAGE) == RFC_SIGNATURE


@pytest.mark.parametrize("size", [0, 1, 64, 4096, 1 << 20])
def test_the_same_keys_and_signatures_as_nacl_signing(size: int) -> None:
    seed, message = os.urandom(32), os.urandom(size)
    ours, theirs = SigningKey(seed), NaclSigningKey(seed)
    assert ours.public == bytes(theirs.verify_key)
    assert ours.sign(message) == theirs.sign(message).signature


def test_central_verifies_what_a_generated_key_signs() -> None:
    key = SigningKey.generate()
    assert key.public != SigningKey.generate().public  # a fresh seed each time
    verifier = Ed25519PublicKey.from_public_bytes(key.public)
    signature = key.sign(b"body")
    verifier.verify(signature, b"body")
    with pytest.raises(InvalidSignature):
        verifier.verify(signature, b"bodY")


def test_a_seed_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes, not 31"):
        SigningKey(b"\0" * 31)


def test_signing_does_not_load_the_rest_of_pynacl() -> None:
    probe = ("import sys; from forwarder.ed25519 import SigningKey; SigningKey.generate().sign(b'x'); "
             "print(sorted(m for m in sys.modules if m.startswith('nacl')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=processes.REPO, check=True)
    assert done.stdout.strip() == "['nacl', 'nacl._sodium']"
