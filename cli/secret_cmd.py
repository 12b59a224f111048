"""`pairmq secret rotate [--resume] [--stop-after STEP]` and `pairmq show secret [--json]`.

Rules of a rotation (the node side is appliance/keyring.py):
- Run on one host that has the group file and its secret file. It needs all three nodes answering
  before it changes anything; an unreachable node is refused up front with nothing changed.
- The new secret (32 random bytes, key id = old id + 1) is written to the secret file next to the old
  one (old first: still the one sent with) before any node sees it, so a crash of the CLI never loses
  it; that two-key file is what `--resume` continues from.
- Three steps, each on monitor, standby, active in that order (as Solace rotates its pre-shared key):
    1 add     every node holds the new key too (wrapped under the old key; never in clear)
    2 use     every node sends with the new key; the secret file then lists the new key first
    3 retire  every node drops the old key; the secret file then holds only the new key
  A step starts on any node only once all three confirmed the previous step (each step re-reads all
  three), so no node ever sends with a key a peer does not hold and activity never moves because of it.
- Every step is idempotent: a node that already took it is reported and skipped. A failure (a node
  down, a refusal) stops at once, names the step and the node, and leaves the group working on the
  keys it holds; `pairmq secret rotate --resume` finishes from where it stopped.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pairmq.appliance.config import GroupConfig, load_group
from pairmq.appliance.errors import ConfigError, PairMQError
from pairmq.appliance.keyring import MAX_KEY_ID, Keyring, management_token, wrap
from pairmq.appliance.roles import Role

from .api import ApiError, NodeUnreachable, base_url, get_json, post_json
from .options import add_group, examples, group_path
from .terminal import Terminal

NEW_SECRET_BYTES = 32
STEP_TIMEOUT_S = 5.0


class RotationStopped(PairMQError):
    """A step could not be taken; the sentence names it and how to finish."""


def add_parsers(commands) -> None:
    secret = commands.add_parser(
        "secret", help="rotate the group secret", description="Rotate the group secret on a live group.",
        epilog=examples("pairmq secret rotate --group /etc/pairmq/group.toml",
                        "pairmq secret rotate --resume            # finish a rotation that stopped",
                        "pairmq show secret --json"))
    verbs = secret.add_subparsers(dest="verb", metavar="VERB", parser_class=type(secret))
    secret.set_defaults(handler=lambda args, term: _help(secret, term))
    p = verbs.add_parser("rotate", help="install a new group secret, one node at a time",
                         description=__doc__.split("\n\n", 1)[1], epilog=examples(
                             "pairmq secret rotate", "pairmq secret rotate --stop-after add",
                             "pairmq secret rotate --resume"))
    add_group(p)
    p.add_argument("--resume", action="store_true", help="finish the rotation under way (the secret file holds two keys)")
    p.add_argument("--stop-after", choices=("add", "use"), metavar="STEP",
                   help="stop once every node took STEP (add or use); continue later with --resume")
    p.set_defaults(handler=_cmd_rotate)


def add_show_parser(things) -> None:
    """`pairmq show secret`, next to `show redundancy`."""
    p = things.add_parser("secret", help="each node's secret key ids and the one it sends with",
                          description="Each node's key ids and the one it sends with (never a secret).",
                          epilog=examples("pairmq show secret", "pairmq show secret --json"))
    add_group(p)
    p.add_argument("--json", action="store_true", help='print {"schema": 1, "group", "nodes": [...]}')
    p.set_defaults(handler=_cmd_show)


def _help(parser, term: Terminal) -> int:
    term.print_text(parser.format_help().rstrip())
    return 0


def _config(args) -> GroupConfig:
    return load_group(group_path(args))


# --- reading the group ------------------------------------------------------------------


def _get(config: GroupConfig, role: Role, path: str) -> dict:
    """GET with the token of each key in the secret file, newest first, until the node takes one:
    mid-rotation a node may hold either key."""
    ring = _read_file(config)
    key_ids = sorted(ring.keys, reverse=True)
    for key_id in key_ids:
        try:
            return get_json(f"{base_url(config, role)}{path}", timeout_s=STEP_TIMEOUT_S,
                            token=management_token(ring.keys[key_id]))
        except ApiError as exc:
            if exc.status != 401 or key_id == key_ids[-1]:
                raise
    raise AssertionError("unreachable: the secret file holds at least one key")


def _fetch(config: GroupConfig, role: Role) -> dict:
    try:
        return _get(config, role, "/api/v1/secret")
    except ApiError as exc:
        raise NodeUnreachable(f"cannot reach the {role.value} node at {base_url(config, role)}: {exc}") from None


def _fetch_all(config: GroupConfig) -> dict[Role, dict]:
    return {role: _fetch(config, role) for role in Role}


def _order(config: GroupConfig) -> list[Role]:
    """Monitor, standby, active: the active (the one serving) last."""
    active = None
    for role in (Role.PRIMARY, Role.BACKUP):
        try:
            if _get(config, role, "/api/v1/redundancy").get("serving"):
                active = role
        except ApiError:
            pass
    active = active or Role.PRIMARY
    return [Role.MONITOR, active.mate(), active]


def _cmd_show(args, term: Terminal) -> int:
    from rich.table import Table

    config = _config(args)
    nodes = []
    for role in Role:
        try:
            nodes.append({"reachable": True, **_fetch(config, role)})
        except NodeUnreachable as exc:
            nodes.append({"role": role.value, "reachable": False, "error": str(exc)})
    if args.json:
        term.print_json({"schema": 1, "group": config.name, "nodes": nodes})
        return 0
    try:
        mine = _read_file(config).fingerprints()
        term.note(f"{config.secret_file}: key ids " + ", ".join(f"{kid} ({fp})" for kid, fp in mine.items()))
    except ConfigError as exc:
        term.note(f"this host's secret file cannot be read ({exc})")
    table = Table(title=f"group {config.name}: secret key ids")
    for column in ("node", "key ids (fingerprint)", "sends with"):
        table.add_column(column)
    for n in nodes:
        if n["reachable"]:
            table.add_row(n["role"], ", ".join(f"{kid} ({fp})" for kid, fp in n["fingerprints"].items()),
                          str(n["send_key_id"]))
        else:
            table.add_row(n["role"], "unreachable", "-")
    term.print_table(table)
    return 0


# --- rotating ---------------------------------------------------------------------------


def _write_file(path: Path, ring: Keyring) -> None:
    """Replace the secret file atomically, mode 0600 from the first byte."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(ring.to_text())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_file(config: GroupConfig) -> Keyring:
    try:
        return Keyring.from_text(config.secret_file.read_text(encoding="ascii"), str(config.secret_file))
    except FileNotFoundError:
        raise ConfigError(f"group secret {config.secret_file} does not exist; rotation runs on a host "
                          "that has the group's secret file") from None


def _start(config: GroupConfig, states: dict[Role, dict], term: Terminal) -> tuple[Keyring, int, int]:
    """A fresh rotation: check every node holds just the file's key, then write old + new to the file."""
    ring = _read_file(config)
    if len(ring.keys) != 1:
        raise ConfigError(f"the secret file {config.secret_file} holds key ids "
                          f"{', '.join(map(str, sorted(ring.keys)))}: a rotation is under way; finish it with "
                          "`pairmq secret rotate --resume`")
    old_id = ring.send_id
    _same_secrets(config, ring, states)
    for role, state in states.items():
        if state["key_ids"] != [old_id]:
            raise ConfigError(f"the {role.value} holds key ids {', '.join(map(str, state['key_ids']))}, the secret "
                              f"file only key id {old_id}: finish the rotation under way with "
                              "`pairmq secret rotate --resume`, or fix the secret file; nothing was changed")
    if old_id >= MAX_KEY_ID:
        raise ConfigError(f"key id {old_id} is the last one; create a new group secret with `pairmq init` instead")
    new_id = old_id + 1
    two = Keyring({old_id: ring.send_secret, new_id: secrets.token_bytes(NEW_SECRET_BYTES)}, old_id)
    _write_file(config.secret_file, two)
    term.note(f"new group secret key id {new_id} written next to key id {old_id} in {config.secret_file}")
    return two, old_id, new_id


def _resume(config: GroupConfig, states: dict[Role, dict]) -> tuple[Keyring, int, int]:
    ring = _read_file(config)
    if len(ring.keys) != 2:
        held = {kid for state in states.values() for kid in state["key_ids"]}
        if held == set(ring.keys):
            raise ConfigError(f"there is no rotation to resume: every node holds only key id {ring.send_id}")
        raise ConfigError(f"the secret file {config.secret_file} holds only key id {ring.send_id} but the nodes "
                          f"hold key ids {', '.join(map(str, sorted(held)))}; rotation cannot resume from this file")
    _same_secrets(config, ring, states)
    return ring, min(ring.keys), max(ring.keys)


def _same_secrets(config: GroupConfig, ring: Keyring, states: dict[Role, dict]) -> None:
    """Every key id a node shares with the secret file must be the same secret (by fingerprint)."""
    ours = ring.fingerprints()
    for role, state in states.items():
        for kid, theirs in state["fingerprints"].items():
            if kid in ours and ours[kid] != theirs:
                raise ConfigError(f"the {role.value} holds key id {kid} with another secret (fingerprint {theirs}) "
                                  f"than {config.secret_file} (fingerprint {ours[kid]}): a rotation from another "
                                  "host, or a stale secret file; nothing was changed")


def rotate(config: GroupConfig, term: Terminal, *, resume: bool = False, stop_after: str | None = None) -> int:
    try:
        states = _fetch_all(config)
    except NodeUnreachable as exc:
        hint = "start it and run `pairmq secret rotate --resume`" if resume else "a rotation needs all three nodes answering"
        raise NodeUnreachable(f"{exc}; {hint}; nothing was changed") from None
    ring, old_id, new_id = _resume(config, states) if resume else _start(config, states, term)
    order = _order(config)
    completed: list[dict] = []
    term.record(group=config.name, old_key_id=old_id, new_key_id=new_id, order=[r.value for r in order],
                steps=completed, done=False)
    term.note(f"rotating group {config.name!r} from key id {old_id} to {new_id}, in order "
              f"{', '.join(r.value for r in order)}")

    def step(n: int, name: str, done, body) -> None:
        for role in order:
            state = _fetch_step(config, role, name, n, new_id)
            label = f"step {n}/3 ({name} key id {new_id if name != 'retire' else old_id}): {role.value}"
            if done(state):
                term.note(f"{label}: already done")
                completed.append({"step": name, "node": role.value, "result": "already done"})
                continue
            token = _token(ring, state)
            try:
                answer = post_json(f"{base_url(config, role)}/api/v1/secret/steps", body(role), token=token,
                                   timeout_s=STEP_TIMEOUT_S)
            except ApiError as exc:
                raise RotationStopped(f"step {n}/3 ({name}) failed on the {role.value}: {exc}; the group keeps "
                                      f"working on the keys it holds; run `pairmq secret rotate --resume`") from None
            term.note(f"{label}: done (holds key ids {', '.join(map(str, answer['key_ids']))}, "
                      f"sends with {answer['send_key_id']})")
            completed.append({"step": name, "node": role.value, "result": "done", "key_ids": answer["key_ids"],
                              "send_key_id": answer["send_key_id"]})
        for role in Role:  # every node confirms before the next step starts anywhere
            if not done(_fetch_step(config, role, name, n, new_id)):
                raise RotationStopped(f"step {n}/3 ({name}) is not confirmed by the {role.value}; "
                                      "run `pairmq secret rotate --resume`")

    def add_body(role: Role) -> dict:
        return {"step": "add", "key_id": new_id, "wrapped": wrap(
            ring.keys[new_id], key_id=new_id, wrapping=Keyring({old_id: ring.keys[old_id]}, old_id),
            group=config.name, role=role.value, nonce=secrets.token_bytes(12))}

    step(1, "add", lambda s: new_id in s["key_ids"], add_body)
    if stop_after == "add":
        term.record(stopped_after="add")
        term.note("stopped after step 1/3 as asked: every node accepts both keys; "
                  "continue with `pairmq secret rotate --resume`")
        return 0
    step(2, "use", lambda s: s["send_key_id"] == new_id, lambda role: {"step": "use", "key_id": new_id})
    _write_file(config.secret_file, Keyring(ring.keys, new_id))
    if stop_after == "use":
        term.record(stopped_after="use")
        term.note("stopped after step 2/3 as asked: every node sends with the new key and still accepts the old "
                  "one; continue with `pairmq secret rotate --resume`")
        return 0
    step(3, "retire", lambda s: old_id not in s["key_ids"], lambda role: {"step": "retire", "key_id": old_id})
    _write_file(config.secret_file, Keyring({new_id: ring.keys[new_id]}, new_id))
    term.record(done=True, secret_file=str(config.secret_file))
    term.note(f"rotation done: every node holds only key id {new_id}; {config.secret_file} holds it. Copy that "
              "file (or the credential) to the other hosts before you next reinstall one")
    return 0


def _fetch_step(config: GroupConfig, role: Role, name: str, n: int, new_id: int) -> dict:
    try:
        return _fetch(config, role)
    except NodeUnreachable as exc:
        raise RotationStopped(f"step {n}/3 ({name}) stopped: {exc}; the group keeps working on the keys it "
                              "holds; start it and run `pairmq secret rotate --resume`") from None


def _token(ring: Keyring, state: dict) -> str:
    """The management token of a key the node holds (the new one once it has it)."""
    held = [kid for kid in sorted(ring.keys, reverse=True) if kid in state["key_ids"]]
    if not held:
        raise RotationStopped(f"the {state['role']} holds none of the secret file's keys "
                              f"({', '.join(map(str, state['key_ids']))}); its secret differs from this group's")
    return management_token(ring.keys[held[0]])


def _cmd_rotate(args, term: Terminal) -> int:
    return rotate(_config(args), term, resume=args.resume, stop_after=args.stop_after)
