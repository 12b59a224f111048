"""Group file and secret validation: every mistake is one clear sentence."""

import os
import tomllib
from pathlib import Path

import pytest

from pairmq.appliance.config import GroupConfig, NodeSpec, Timers, load_group, load_secret, parse_group, render_group, write_secret
from pairmq.appliance.errors import ConfigError
from pairmq.appliance.roles import Role
from tests.harness.certs import make_pki, other_key_pem


def group_text(tmp_path, **timers) -> str:
    nodes = {r: NodeSpec(r, f"127.0.0.{i + 1}", tmp_path / r.value) for i, r in enumerate(Role)}
    return render_group(GroupConfig("g", nodes, tmp_path / "secret", Timers(**timers)))


def test_defaults_round_trip_and_fail_over_well_under_two_seconds(tmp_path):
    (tmp_path / "group.toml").write_text(group_text(tmp_path))
    config = load_group(tmp_path / "group.toml")
    assert config.timers == Timers()
    assert config.timers.expected_failover_ms < 1_000
    assert config.host_list() == "127.0.0.1:1883,127.0.0.2:1883"


@pytest.mark.parametrize("timers,relation", [
    ({"heartbeat_interval_ms": 200, "lease_ms": 500}, "lease_ms (500) must be at least 4 x heartbeat_interval_ms (800)"),
    ({"takeover_margin_ms": 20}, "takeover_margin_ms (20) must be at least heartbeat_interval_ms (50)"),
    ({"lease_ms": 5000, "takeover_margin_ms": 100}, "takeover_margin_ms (100) must be at least lease_ms / 10 (500)"),
    ({"heartbeat_interval_ms": 5}, "heartbeat_interval_ms (5) must be at least 10"),
    ({"lease_ms": -1}, "timers.lease_ms must be a positive whole number"),
    ({"broker_stall_ms": 1500}, "broker_stall_ms (1500) must be at least 4 x lease_ms (2000)"),
    ({"broker_stall_ms": 60_001}, "timers.broker_stall_ms (60001) must be at most 60000"),
    ({"broker_stall_ms": True}, "timers.broker_stall_ms must be a positive whole number"),
])
def test_unsafe_timers_name_the_relation(tmp_path, timers, relation):
    raw = tomllib.loads(group_text(tmp_path))
    raw["timers"].update(timers)
    with pytest.raises(ConfigError, match=relation.replace("(", r"\(").replace(")", r"\)")):
        parse_group(raw)


@pytest.mark.parametrize("edit,message", [
    (lambda r: r["timers"].update(lease=500), "unknown key 'lease' in \\[timers\\]"),
    (lambda r: r.pop("nodes"), "needs a \\[nodes\\] table"),
    (lambda r: r["nodes"].pop("monitor"), "needs a \\[nodes.monitor\\] table"),
    (lambda r: r["nodes"]["backup"].update(address="not-an-ip"), "nodes.backup.address must be an IP address"),
    (lambda r: r["nodes"]["backup"].update(address="127.0.0.1"), "distinct addresses"),
    (lambda r: r["ports"].update(mqtt=8080), "are both 8080"),
    (lambda r: r["group"].update(name=""), "group.name must be"),
])
def test_bad_group_files_are_refused_clearly(tmp_path, edit, message):
    raw = tomllib.loads(group_text(tmp_path))
    edit(raw)
    with pytest.raises(ConfigError, match=message):
        parse_group(raw)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_group(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[group\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_group(tmp_path / "bad.toml")


def test_secret_is_created_0600_and_refused_when_readable_by_others(tmp_path):
    (tmp_path / "group.toml").write_text(group_text(tmp_path))
    config = load_group(tmp_path / "group.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_secret(config)
    write_secret(config.secret_file)
    assert os.stat(config.secret_file).st_mode & 0o777 == 0o600
    assert len(load_secret(config)) == 32
    os.chmod(config.secret_file, 0o644)
    with pytest.raises(ConfigError, match="readable by others.*chmod 600"):
        load_secret(config)
    os.chmod(config.secret_file, 0o600)
    config.secret_file.write_text("zz-not-hex\n")
    with pytest.raises(ConfigError, match="hex"):
        load_secret(config)


def test_systemd_credential_takes_precedence(tmp_path, monkeypatch):
    (tmp_path / "group.toml").write_text(group_text(tmp_path))
    config = load_group(tmp_path / "group.toml")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "pairmq-secret").write_text("ab" * 32)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert load_secret(config) == bytes.fromhex("ab" * 32)


# --- [tls] ------------------------------------------------------------------------------------


def tls_group(tmp_path, cert="server.pem", key="server.key") -> Path:
    text = group_text(tmp_path) + f'\n[tls]\ncert_file = "{cert}"\nkey_file = "{key}"\n'
    path = tmp_path / "pki" / "group.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_tls_paths_are_relative_to_the_group_file_and_round_trip(tmp_path):
    pki = make_pki(tmp_path / "pki")
    config = load_group(tls_group(tmp_path))
    assert (config.tls.cert_file, config.tls.key_file) == (pki.cert_file, pki.key_file)
    assert config.ports.mqtt_tls == 8883
    assert parse_group(tomllib.loads(render_group(config))).tls == config.tls
    assert load_group(tmp_path / "pki" / "group.toml").tls is not None


@pytest.mark.parametrize("damage, message", [
    (lambda pki: pki.cert_file.unlink(), "tls.cert_file {cert} does not exist"),
    (lambda pki: pki.key_file.unlink(), "tls.key_file {key} does not exist"),
    (lambda pki: pki.cert_file.write_text("not a certificate"), "tls.cert_file {cert} is not a PEM certificate"),
    (lambda pki: pki.key_file.write_text("not a key"), "tls.key_file {key} is not a PEM private key"),
    (lambda pki: pki.key_file.write_bytes(other_key_pem()),
     "tls.key_file {key} does not match the certificate in tls.cert_file {cert}"),
])
def test_bad_tls_files_are_refused_at_load(tmp_path, damage, message):
    pki = make_pki(tmp_path / "pki")
    damage(pki)
    with pytest.raises(ConfigError) as err:
        load_group(tls_group(tmp_path))
    assert message.format(cert=pki.cert_file, key=pki.key_file) in str(err.value)


def test_an_encrypted_key_is_refused_with_the_reason(tmp_path):
    make_pki(tmp_path / "pki", key_password=b"pass")
    with pytest.raises(ConfigError, match="is encrypted; the node needs an unencrypted key"):
        load_group(tls_group(tmp_path))


@pytest.mark.parametrize("table, message", [
    ('[tls]\ncert_file = "server.pem"\n', "tls.key_file must be the path of a PEM file"),
    ('[tls]\ncert_file = "a"\nkey_file = "b"\nport = 8883\n', "unknown key 'port' in [tls]"),
    ('[tls]\ncert_file = 5\nkey_file = "b"\n', "tls.cert_file must be the path of a PEM file"),
])
def test_bad_tls_tables(tmp_path, table, message):
    (tmp_path / "group.toml").write_text(group_text(tmp_path) + "\n" + table)
    with pytest.raises(ConfigError) as err:
        load_group(tmp_path / "group.toml")
    assert message in str(err.value)


def test_limits_round_trip_and_reach_the_broker_core(tmp_path):
    from pairmq.appliance.broker.core import limits_from_config
    from pairmq.appliance.config import Limits

    raw = tomllib.loads(group_text(tmp_path))
    assert raw["limits"] == {"session_queue_max_messages": 100_000, "session_queue_max_bytes": 64 << 20,
                             "spool_max_bytes": 4 << 30, "message_id_window_s": 300,
                             "message_id_history_max": 100_000, "mate_max_lag_ops": 10_000,
                             "mate_max_lag_bytes": 64 << 20, "session_other_user_clean_start": 0,
                             "login_checks_per_address_per_min": 30, "login_checks_per_user_per_min": 30,
                             "password_min_length": 8,
                             "mqtt_connect_max_bytes": 128 << 10, "mqtt_connect_max_properties": 128,
                             "mqtt_preauth_max_connections": 40_000, "mqtt_preauth_max_per_address": 1_000,
                             "mqtt_preauth_max_bytes": 64 << 20, "mqtt_output_max_bytes": 8 << 20,
                             "subscriptions_per_client_max": 10_000, "subscribe_max_filters": 1_000,
                             "max_keepalive_s": 0}
    raw["limits"].update(session_queue_max_messages=50, spool_max_bytes=1 << 20, message_id_window_s=60,
                         message_id_history_max=7, mate_max_lag_ops=20)
    config = parse_group(raw)
    assert config.limits == Limits(50, 64 << 20, 1 << 20, 60, 7, 20, 64 << 20)
    assert limits_from_config(Limits(subscriptions_per_client_max=5, subscribe_max_filters=3)).max_subscriptions == 5
    assert limits_from_config(Limits(max_keepalive_s=30)).max_keep_alive_s == 30
    core = limits_from_config(config.limits)
    assert (core.max_queued_messages, core.max_queued_bytes, core.max_spool_bytes) == (50, 64 << 20, 1 << 20)
    assert (core.message_id_window_ms, core.max_message_ids) == (60_000, 7)

    del raw["limits"]
    assert parse_group(raw).limits == Limits()  # the table is optional


@pytest.mark.parametrize("key,value,message", [
    ("session_queue_max_messages", 0, "limits.session_queue_max_messages must be a whole number from 1 to"),
    ("session_queue_max_messages", "10", "not '10'"),
    ("session_queue_max_bytes", 100, "limits.session_queue_max_bytes must be a whole number from 1,024 to"),
    ("spool_max_bytes", True, "limits.spool_max_bytes must be a whole number"),
    ("spool_max_bytes", 1.5, "not 1.5"),
    ("queue_max", 10, "unknown key 'queue_max' in \\[limits\\]"),
    ("message_id_window_s", 0, "limits.message_id_window_s must be a whole number from 1 to 604,800, not 0"),
    ("message_id_history_max", -5, "limits.message_id_history_max must be a whole number from 1 to"),
    ("mate_max_lag_ops", 0, "limits.mate_max_lag_ops must be a whole number from 1 to 1,000,000, not 0"),
    ("mate_max_lag_bytes", 1000, "limits.mate_max_lag_bytes must be a whole number from 65,536 to"),
])
def test_bad_limits_are_refused_clearly(tmp_path, key, value, message):
    raw = tomllib.loads(group_text(tmp_path))
    raw["limits"][key] = value
    with pytest.raises(ConfigError, match=message):
        parse_group(raw)


def test_sys_interval_defaults_to_mosquittos_and_is_checked(tmp_path):
    raw = tomllib.loads(group_text(tmp_path))
    assert "sys" not in raw and parse_group(raw).sys.interval_s == 10
    raw["sys"] = {"interval_s": 0}
    assert parse_group(raw).sys.interval_s == 0  # off
    for bad in (-1, 86_401, "10", True):
        raw["sys"] = {"interval_s": bad}
        with pytest.raises(ConfigError, match=r"sys\.interval_s must be a whole number"):
            parse_group(raw)
    raw["sys"] = {"sys_interval": 5}
    with pytest.raises(ConfigError, match="unknown key 'sys_interval' in \\[sys\\]"):
        parse_group(raw)
    raw["limits"] = {"max_keepalive_s": 65_536}
    del raw["sys"]
    with pytest.raises(ConfigError, match=r"limits\.max_keepalive_s must be a whole number from 0 to 65,535"):
        parse_group(raw)
