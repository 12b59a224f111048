"""The configuration export file: it round-trips, a hostile or foreign file is refused with one sentence naming
what is wrong, and the differences an import shows are the ones between the two documents."""

from __future__ import annotations

import json

import pytest

from pairmq.appliance.broker.access import hash_password
from pairmq.configsync.backup import (FORMAT, FORMAT_VERSION, MAX_IMPORT_BYTES, Export, ImportRefused, differences,
                                      parse_export)
from pairmq.configsync.changes import apply_change
from pairmq.configsync.document import ConfigDocument

RECORD = hash_password(b"secret-ann", b"s" * 16, n=2, r=1, p=1).to_document()
OTHER_RECORD = hash_password(b"secret-ann-2", b"t" * 16, n=2, r=1, p=1).to_document()
RULE = {"effect": "allow", "action": "publish", "filter": "cars/#", "who": "user:ann"}


def document(*changes: dict) -> ConfigDocument:
    doc = ConfigDocument()
    for change in changes:
        doc = apply_change(doc, change)
    return doc


ANN = {"kind": "user.set", "username": "ann", "record": RECORD}
SAMPLE = document(ANN, {"kind": "acl.add", "rule": RULE}, {"kind": "anonymous.set", "allowed": False},
                  {"kind": "limits.set", "name": "session_queue_max_messages", "value": 500})


def exported(**overrides) -> dict:
    doc = Export("orders", 7, SAMPLE, "2026-11-29T01:00:00+00:00", "primary").to_json()
    doc.update(overrides)
    return doc


def encode(doc) -> bytes:
    return json.dumps(doc).encode()


def test_an_export_round_trips_with_its_version_digest_and_password_records():
    doc = exported()
    assert doc["format"] == FORMAT and doc["format_version"] == FORMAT_VERSION
    assert doc["digest"] == SAMPLE.digest() and doc["document"]["access"]["users"]["ann"] == RECORD
    back = parse_export(encode(doc))
    assert (back.group, back.config_version, back.document) == ("orders", 7, SAMPLE)
    assert back.exported_from == "primary"


def test_a_file_without_its_digest_is_taken_as_edited_on_purpose():
    doc = exported()
    del doc["digest"]
    doc["document"]["limits"] = {"session_queue_max_messages": 900}
    assert parse_export(encode(doc)).document.limits == {"session_queue_max_messages": 900}


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("data, fragment", [
    (b"x" * (MAX_IMPORT_BYTES + 1), f"at most {MAX_IMPORT_BYTES:,}"),
    (b"{not json", "is not JSON"),
    (b"\xff\xfe\x00garbage", "is not JSON"),
    (nested(100_000), "nests too deeply"),
    (b"[]", "is not a PairMQ configuration export"),
    (b"null", "is not a PairMQ configuration export"),
    (encode({"format": "emqx-backup"}), "is not a PairMQ configuration export"),
    (encode(exported(format_version=2)), "export format 2 by a newer PairMQ"),
    (encode(exported(format_version="1")), "format_version must be a whole number"),
    (encode(exported(format_version=True)), "format_version must be a whole number"),
    (encode(exported(config_version="7")), "config_version must be a whole number"),
    (encode(exported(config_version=-1)), "config_version must be a whole number"),
    (encode(exported(group=["orders"])), "group must be a string"),
    (encode(exported(group="g" * 10_000)), "group must be a string"),
    (encode(exported(extra=1)), "unknown field 'extra'"),
    (encode({k: v for k, v in exported().items() if k != "document"}), "'document' is missing"),
    (encode(exported(document=[])), "document must be a JSON object"),
    (encode(exported(digest="0" * 64)), "does not match its digest"),
    (encode(exported(digest=5)), "digest must be 64 lower-case hex digits"),
    (encode(exported(document={**exported()["document"], "limits": "lots"})), "document.limits must be an object"),
    (encode(exported(document={**exported()["document"], "limits": {"session_queue_max_messages": "9"}})),
     "session_queue_max_messages must be a whole number"),
    (encode(exported(document={**exported()["document"], "auto_revert": "yes"})), "auto_revert must be true"),
    (encode(exported(document={**exported()["document"], "version": 99})), "document.version must be 1"),
    (encode(exported(document={**exported()["document"], "access": {"users": {"ann": {**RECORD, "n": 3}}}})),
     "document.access"),
    (encode(exported(document={**exported()["document"], "access": {"users": "ann"}})), "document.access"),
    (encode(exported(document={**exported()["document"], "access": {**exported()["document"]["access"],
                                                                     "acl": [{**RULE, "filter": "a/#/b"}]}})),
     "a/#/b"),
    (b'{"format": "pairmq-config-export", "format_version": 1' + b", " * 10 + b"}", "is not JSON"),
    (b'{"format": "pairmq-config-export", "format_version": 1' + b"9" * 5000 + b"}", "is not JSON"),
])
def test_a_hostile_file_is_refused_with_one_sentence_naming_why(data, fragment):
    with pytest.raises(ImportRefused) as caught:
        parse_export(data, "backup.json")
    message = str(caught.value)
    assert fragment in message and message.startswith("backup.json") and "\n" not in message
    assert len(message) < 400, message


def test_no_differences_between_equal_documents():
    assert differences(SAMPLE, SAMPLE) == []
    assert differences(ConfigDocument(), ConfigDocument()) == []


def test_differences_name_every_section_and_never_a_password_record():
    rule_b = {"effect": "deny", "action": "subscribe", "filter": "secret/#", "who": "all"}
    imported = document({"kind": "user.set", "username": "ann", "record": OTHER_RECORD},
                        {"kind": "user.set", "username": "bob", "record": RECORD},
                        {"kind": "acl.add", "rule": rule_b}, {"kind": "acl.add", "rule": RULE},
                        {"kind": "overload.set", "name": "max_window", "value": 50},
                        {"kind": "auto_revert.set", "enabled": False}, {"kind": "anonymous.set", "allowed": True})
    current = document(ANN, {"kind": "user.set", "username": "carl", "record": RECORD},
                       {"kind": "acl.add", "rule": RULE}, {"kind": "anonymous.set", "allowed": False},
                       {"kind": "limits.set", "name": "session_queue_max_messages", "value": 500})
    found = [d.sentence() for d in differences(current, imported)]
    assert found == [
        "users ann: password record -> replaced",
        "users bob: absent -> added",
        "users carl: present -> removed",
        "anonymous: refused -> allowed",
        "acl rule 0: absent -> deny subscribe 'secret/#' for all",
        "limits session_queue_max_messages: 500 -> default",
        "overload max_window: default -> 50",
        "auto_revert: as in the group file -> off",
    ]
    text = json.dumps([d.to_json() for d in differences(current, imported)])
    assert RECORD["hash"] not in text and OTHER_RECORD["hash"] not in text


def test_a_rule_that_moved_is_a_difference():
    rule_b = {"effect": "deny", "action": "subscribe", "filter": "secret/#", "who": "all"}
    ab = document({"kind": "acl.add", "rule": RULE}, {"kind": "acl.add", "rule": rule_b})
    ba = document({"kind": "acl.add", "rule": rule_b}, {"kind": "acl.add", "rule": RULE})
    found = [d.sentence() for d in differences(ab, ba)]
    assert len(found) == 2 and any("removed" in f for f in found) and any("absent ->" in f for f in found)
