"""Ed25519 (RFC 8032) signing on the VM: libsodium's documented C calls through PyNaCl's compiled binding.

PyNaCl's public `nacl.signing` imports the whole of `nacl.bindings` (box, secretbox, pwhash, kx, ...: 15
modules) and `nacl.public` for the three calls the forwarder makes. In the running forwarder, idle:
32.7 MiB with nacl.signing against 31.8 MiB with this module, side by side in one bench run (issue 49;
docs/forwarder.md, "Footprint"). So this is the ONE module that touches PyNaCl's private `nacl._sodium`
(its cffi `ffi` and `lib`), and it calls only libsodium's stable public API: sodium_init,
crypto_sign_seed_keypair and crypto_sign. tests/forwarder/test_ed25519.py fails when PyNaCl changes
under it: the keys and signatures here must equal `nacl.signing`'s, byte for byte, for the same seed.
"""

from __future__ import annotations

import os

from nacl._sodium import ffi, lib

SEED_BYTES = 32
PUBLIC_KEY_BYTES = 32
SECRET_KEY_BYTES = 64
SIGNATURE_BYTES = 64

# 0: initialised now, 1: already initialised; -1: libsodium cannot run here (no usable entropy source)
if lib.sodium_init() < 0:
    raise ImportError("libsodium failed to initialise (sodium_init() < 0)")


class SigningKey:
    """An Ed25519 key pair made from a 32-byte seed; `public` is the raw public key."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) != SEED_BYTES:
            raise ValueError(f"an Ed25519 seed is {SEED_BYTES} bytes, not {len(seed)}")
        public = ffi.new("unsigned char[]", PUBLIC_KEY_BYTES)
        secret = ffi.new("unsigned char[]", SECRET_KEY_BYTES)
        if lib.crypto_sign_seed_keypair(public, secret, seed) != 0:
            raise RuntimeError("libsodium could not derive an Ed25519 key pair")
        self.public: bytes = ffi.buffer(public, PUBLIC_KEY_BYTES)[:]
        self._secret: bytes = ffi.buffer(secret, SECRET_KEY_BYTES)[:]

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(os.urandom(SEED_BYTES))  # the OS's CSPRNG, as libsodium's randombytes uses

    def sign(self, message: bytes) -> bytes:
        """The 64-byte signature of `message` (crypto_sign's signed message is signature || message)."""
        signed = ffi.new("unsigned char[]", SIGNATURE_BYTES + len(message))
        length = ffi.new("unsigned long long *")
        if lib.crypto_sign(signed, length, message, len(message), self._secret) != 0:
            raise RuntimeError("libsodium could not sign")
        return ffi.buffer(signed, SIGNATURE_BYTES)[:]
