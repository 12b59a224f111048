"""The management API listener's settings: the group file's optional [management] table.

Rules:
- Per listener, checked at load (files included): a node never starts half-configured.
- HTTPS when `cert_file` and `key_file` are set (TLS >= 1.2). The CLI and the nodes' status fan-out
  verify the certificate against `ca_file`, by default the certificate itself: the self-signed one
  `pairmq init --management-tls` makes is thereby pinned. Standard library only at import (the
  installer reads the group file without aiohttp).
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import ssl
from pathlib import Path

from ..errors import ConfigError

KEYS = {"idle_timeout_ms", "body_timeout_ms", "max_connections", "max_connections_per_address", "cert_file",
        "key_file", "ca_file"}


@dataclasses.dataclass(frozen=True, slots=True)
class ManagementSettings:
    idle_timeout_ms: int = 10_000
    body_timeout_ms: int = 30_000
    max_connections: int = 512
    max_connections_per_address: int = 64  # above the decision streams one address may open (32)
    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None

    RANGES = {"idle_timeout_ms": (100, 600_000), "body_timeout_ms": (100, 600_000),
              "max_connections": (4, 60_000), "max_connections_per_address": (1, 60_000)}

    @property
    def https(self) -> bool:
        return self.cert_file is not None

    @property
    def scheme(self) -> str:
        return "https" if self.https else "http"

    @property
    def trust_file(self) -> Path | None:
        return self.ca_file or self.cert_file

    def validate(self) -> None:
        for name, (low, high) in self.RANGES.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(f"management.{name} must be a whole number from {low:,} to {high:,}, not {value!r}")
        if self.max_connections_per_address > self.max_connections:
            raise ConfigError("management.max_connections_per_address must be at most management.max_connections")
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("[management] needs both cert_file and key_file for HTTPS, or neither")
        if self.ca_file is not None and self.cert_file is None:
            raise ConfigError("management.ca_file is only used with HTTPS (cert_file and key_file)")


def parse_settings(table: dict, base: Path) -> ManagementSettings:
    """The [management] table; paths relative to the group file's directory. Files are loaded here."""
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in [management] (known: {', '.join(sorted(KEYS))})")
    values = dict(table)
    for key in ("cert_file", "key_file", "ca_file"):
        if key in values:
            if not isinstance(values[key], str) or not values[key]:
                raise ConfigError(f"management.{key} must be the path of a PEM file")
            values[key] = (base / values[key]).resolve()
    settings = ManagementSettings(**values)
    settings.validate()
    if settings.https:
        from ..config import TlsConfig
        from ..tls import check_tls_files

        try:
            check_tls_files(TlsConfig(settings.cert_file, settings.key_file))
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("tls.", "management.")) from None
        client_context(settings)
    return settings


def render_settings(settings: ManagementSettings) -> list[str]:
    """The [management] table's lines for the group file; none when everything is the default."""
    if settings == ManagementSettings():
        return []
    lines = ["", "[management]"]
    for field in dataclasses.fields(ManagementSettings):
        value = getattr(settings, field.name)
        if value is not None:
            text = str(value).replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'{field.name} = "{text}"' if isinstance(value, Path) else f"{field.name} = {value}")
    return lines


def server_context(settings: ManagementSettings) -> ssl.SSLContext | None:
    if not settings.https:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(settings.cert_file, settings.key_file)
    return context


def client_context(settings: ManagementSettings) -> ssl.SSLContext | None:
    """What the CLI and the peers trust: `ca_file`, or the node certificate itself (pinned)."""
    if not settings.https:
        return None
    try:
        context = ssl.create_default_context(cafile=str(settings.trust_file))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"cannot load management.ca_file {settings.trust_file}: {exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def make_self_signed(cert_file: Path, key_file: Path, addresses: list[str], group: str) -> None:
    """An EC P-256 key (0600) and a self-signed certificate naming the three node addresses, for 10 years."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"PairMQ management {group}"[:64])])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
