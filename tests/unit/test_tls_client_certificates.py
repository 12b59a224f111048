"""[tls] client-certificate keys at load (require_certificate, ca_file, use_identity_as_username) and the
identity a verified certificate yields, from a real TLS handshake in memory (no sockets)."""

from __future__ import annotations

import ssl
import tomllib

import pytest

from pairmq.appliance.config import TlsConfig, load_group, parse_group, render_group
from pairmq.appliance.errors import ConfigError
from pairmq.appliance.tls import certificate_identity, server_context
from tests.harness.certs import ClientCa, make_pki
from tests.unit.test_config import tls_group


def with_keys(tmp_path, extra: str):
    path = tls_group(tmp_path)
    path.write_text(path.read_text() + extra)
    return path


def test_the_keys_load_relative_to_the_group_file_and_round_trip(tmp_path):
    make_pki(tmp_path / "pki")
    ClientCa(tmp_path / "pki")
    config = load_group(with_keys(tmp_path, 'require_certificate = true\nca_file = "client-ca.pem"\n'
                                            'use_identity_as_username = "san"\n'))
    assert config.tls.require_certificate and config.tls.use_identity_as_username == "san"
    assert config.tls.ca_file == tmp_path / "pki" / "client-ca.pem"
    assert parse_group(tomllib.loads(render_group(config))).tls == config.tls
    assert (config.ports.mqtt_ws, config.ports.mqtt_wss) == (8083, 8084)


@pytest.mark.parametrize("extra, message", [
    ("require_certificate = true\n", "tls.require_certificate needs tls.ca_file"),
    ('use_identity_as_username = "cn"\nca_file = "client-ca.pem"\n',
     "tls.use_identity_as_username needs tls.require_certificate = true"),
    ('require_certificate = true\nca_file = "client-ca.pem"\nuse_identity_as_username = "dn"\n',
     'tls.use_identity_as_username must be "cn" or "san"'),
    ('require_certificate = "yes"\n', "tls.require_certificate must be true or false"),
    ('require_certificate = true\nca_file = "missing.pem"\n', "tls.ca_file {pki}/missing.pem does not exist"),
    ('require_certificate = true\nca_file = "server.key"\n', "tls.ca_file {pki}/server.key holds no PEM certificate"),
])
def test_bad_client_certificate_keys_are_refused_at_load(tmp_path, extra, message):
    make_pki(tmp_path / "pki")
    ClientCa(tmp_path / "pki")
    with pytest.raises(ConfigError) as err:
        load_group(with_keys(tmp_path, extra))
    assert message.format(pki=tmp_path / "pki") in str(err.value)


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> ssl.SSLObject:
    """Both sides of a TLS handshake over memory BIOs; the server's SSLObject once it is done."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(s_in, s_out, server_side=True)
    c = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    done = {"s": False, "c": False}
    for _ in range(10):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    return s


@pytest.mark.parametrize("source, expected", [("cn", "alice"), ("san", "alice.devices.example")])
def test_the_identity_is_the_cn_or_the_first_san(tmp_path, source, expected):
    pki, clients = make_pki(tmp_path / "pki"), ClientCa(tmp_path / "clients")
    cert, key = clients.issue("alice", dns_san="alice.devices.example")
    server = server_context(TlsConfig(pki.cert_file, pki.key_file, True, clients.ca_file, source))
    client = ssl.create_default_context(cafile=str(pki.ca_file))
    client.load_cert_chain(str(cert), str(key))
    assert certificate_identity(source)(handshake(server, client)) == expected
    assert certificate_identity(source)(None) is None


def test_a_certificate_without_a_san_has_no_san_identity(tmp_path):
    pki, clients = make_pki(tmp_path / "pki"), ClientCa(tmp_path / "clients")
    cert, key = clients.issue("bob")
    server = server_context(TlsConfig(pki.cert_file, pki.key_file, True, clients.ca_file, "san"))
    client = ssl.create_default_context(cafile=str(pki.ca_file))
    client.load_cert_chain(str(cert), str(key))
    assert certificate_identity("san")(handshake(server, client)) is None
