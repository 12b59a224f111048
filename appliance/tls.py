"""MQTT over TLS: checking the group file's certificate and key, and the server context.

Rules:
- The certificate file is PEM: the server certificate first, then any
  intermediates. The key file is an unencrypted PEM private key (a node
  starts unattended: there is nobody to type a passphrase).
- The key must match the certificate's public key.
- TLS 1.2 is the minimum; OpenSSL's default cipher list otherwise.
- Client certificates (mosquitto's names): with `require_certificate`, every
  client on 8883 and 8084 must present a certificate that chains to a CA in
  `ca_file` (PEM, one or more); one without, or from another CA, fails the
  handshake with a TLS alert. Without it, clients are not asked for one.
- `use_identity_as_username = "cn" | "san"` (needs `require_certificate`):
  the certificate's subject CN, or its first DNS (else e-mail) subject
  alternative name, becomes the CONNECT's user name, replacing whatever the
  client sent; no password is asked or checked. The identity must be a user
  of the access file (its ACL applies; deleting it drops its clients).
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


IDENTITY_SOURCES = ("cn", "san")


def check_tls_settings(tls) -> None:
    """The client-certificate keys' relations (a config.TlsConfig), before any file is read."""
    if tls.use_identity_as_username is not None and tls.use_identity_as_username not in IDENTITY_SOURCES:
        raise ConfigError(f"tls.use_identity_as_username must be \"cn\" or \"san\", not "
                          f"{tls.use_identity_as_username!r}")
    if tls.use_identity_as_username is not None and not tls.require_certificate:
        raise ConfigError("tls.use_identity_as_username needs tls.require_certificate = true (a client without a "
                          "certificate would have no identity)")
    if tls.require_certificate and tls.ca_file is None:
        raise ConfigError("tls.require_certificate needs tls.ca_file: the PEM file of the CA(s) that sign the "
                          "clients' certificates")


def check_client_certificates(tls) -> None:
    """The client-certificate keys of a config.TlsConfig: their relations, then the CA file as OpenSSL loads it."""
    check_tls_settings(tls)
    if tls.ca_file is not None:
        try:
            cas = x509.load_pem_x509_certificates(_read(tls.ca_file, "ca_file"))
        except ValueError as exc:
            raise ConfigError(f"tls.ca_file {tls.ca_file} holds no PEM certificate ({exc})") from None
        if not cas:
            raise ConfigError(f"tls.ca_file {tls.ca_file} holds no PEM certificate")
    server_context(tls)


def check_tls_files(tls) -> None:
    """Load both files and compare the keys; `tls` has `cert_file` and `key_file` (a config.TlsConfig, or the
    management API's settings)."""
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
    _context_with_key(tls)  # what OpenSSL itself thinks, with our settings


def _context_with_key(tls) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls: OpenSSL refuses tls.cert_file {tls.cert_file} with tls.key_file "
                          f"{tls.key_file}: {exc}") from None
    return context


def server_context(tls) -> ssl.SSLContext:
    """The MQTT listeners' context (8883, 8084) for a config.TlsConfig."""
    context = _context_with_key(tls)
    if tls.require_certificate:
        try:
            context.load_verify_locations(cafile=tls.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"tls: OpenSSL refuses tls.ca_file {tls.ca_file}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def certificate_identity(source: str) -> Callable[[ssl.SSLObject | None], str | None]:
    """`identity(ssl_object)`: the verified client certificate's CN ("cn") or first SAN ("san"), or None."""
    if source not in IDENTITY_SOURCES:
        raise ValueError(f"identity source {source!r}")

    def identity(ssl_object: ssl.SSLObject | None) -> str | None:
        cert = ssl_object.getpeercert() if ssl_object is not None else None
        if not cert:
            return None
        if source == "cn":
            names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
        else:
            sans = cert.get("subjectAltName", ())
            names = [v for k, v in sans if k == "DNS"] + [v for k, v in sans if k == "email"]
        return names[0] if names and names[0] else None

    return identity


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
