"""Loopback TLS termination for the footprint bench: the sandbox servers speak plain TCP; the forwarder
reaches them over TLS, as in Azure, with a certificate made for this run (trusted through SSL_CERT_FILE
and REQUESTS_CA_BUNDLE in the forwarder's environment only)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import select
import socket
import ssl
import threading
from pathlib import Path
from typing import List, Sequence, Tuple


def make_certificate(directory: Path, hosts: Sequence[str] = ("127.0.0.1",)) -> Tuple[Path, Path]:
    """A self-signed certificate for the loopback addresses `hosts` (IP SANs); returns (cert, key) paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(h))
                                                        for h in hosts]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "bench-cert.pem", directory / "bench-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class TlsRelay:
    """Accepts TLS on 127.0.0.1:<port>, relays the plain bytes to 127.0.0.1:<target>; one thread per
    connection (a few connections for a few minutes)."""

    def __init__(self, cert: Path, key: Path, target: int, host: str = "127.0.0.1", port: int = 0) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(cert), str(key))
        self.target = target
        self.host = host
        self.sock = socket.create_server((host, port))
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True, name="tls-relay").start()

    def _accept(self) -> None:
        self.sock.settimeout(0.5)
        while not self._stop.is_set():
            try:
                raw, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            worker = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            self._threads.append(worker)
            worker.start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self.context.wrap_socket(raw, server_side=True)
            backend = socket.create_connection(("127.0.0.1", self.target))
        except (OSError, ssl.SSLError):
            raw.close()
            return
        with client, backend:
            while not self._stop.is_set():
                ready, _, _ = select.select([client, backend], [], [], 0.5)
                for side in ready:
                    other = backend if side is client else client
                    try:
                        data = side.recv(65536)
                        if not data:
                            return
                        other.sendall(data)  # the other side may have closed meanwhile (an idle close)
                    except (OSError, ssl.SSLError):
                        return
                try:
                    if client.pending():
                        backend.sendall(client.recv(client.pending()))
                except (OSError, ssl.SSLError):
                    return

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()
