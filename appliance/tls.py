"""MQTT over TLS: checking the group file's certificate and key, and the server context.

Rules:
- The certificate file is PEM: the server certificate first, then any
  intermediates. The key file is an unencrypted PEM private key (a node
  starts unattended: there is nobody to type a passphrase).
- The key must match the certificate's public key.
- TLS 1.2 is the minimum; OpenSSL's default cipher list otherwise. Clients
  are not asked for certificates (they log in with a username and password).
- Every problem is one ConfigError naming the [tls] key and the file.
- A handshake that fails at the TLS level is reported (counted by the
  listener), never dropped silently.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from .errors import ConfigError

MAX_PEM_BYTES = 1024 * 1024


def _read(path: Path, key: str) -> bytes:
    try:
        if path.stat().st_size > MAX_PEM_BYTES:
            raise ConfigError(f"tls.{key} {path} is larger than {MAX_PEM_BYTES >> 10} KiB; is it a PEM file?")
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"tls.{key} {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read tls.{key} {path}: {exc.strerror or exc}") from None


def check_tls_files(tls) -> None:
    """Load both files and compare the keys; `tls` has `cert_file` and `key_file` (a config.TlsConfig)."""
    cert_pem = _read(tls.cert_file, "cert_file")
    key_pem = _read(tls.key_file, "key_file")
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise ConfigError(f"tls.cert_file {tls.cert_file} is not a PEM certificate ({exc})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise ConfigError(f"tls.key_file {tls.key_file} is encrypted; the node needs an unencrypted key "
                          f"(protect it with mode 0600 instead)") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"tls.key_file {tls.key_file} is not a PEM private key ({exc})") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if (key.public_key().public_bytes(serialization.Encoding.DER, public)
            != cert.public_key().public_bytes(serialization.Encoding.DER, public)):
        raise ConfigError(f"tls.key_file {tls.key_file} does not match the certificate in tls.cert_file "
                          f"{tls.cert_file}")
    server_context(tls)  # what OpenSSL itself thinks, with our settings


def server_context(tls) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls: OpenSSL refuses tls.cert_file {tls.cert_file} with tls.key_file "
                          f"{tls.key_file}: {exc}") from None
    return context


def report_handshake_failures(context: ssl.SSLContext, on_failure: Callable[[str], None]) -> None:
    """Call `on_failure(reason)` for every server-side handshake that fails at the TLS level.

    asyncio (and uvloop) run a server's handshake on an `SSLObject` made by the context and drop a failed
    one silently (it never reaches the protocol); the context's SSLObject class is the one place that sees
    it. Running the handshake ourselves with start_tls instead races the stream reader, which can swallow
    the ClientHello (seen: half the handshakes hung under uvloop).
    """

    class ReportingSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise
            except ssl.SSLError as exc:
                on_failure(str(exc))
                raise

    context.sslobject_class = ReportingSSLObject
