"""A process that writes a spool through the real writer and kills itself with SIGKILL at a chosen point.

Run as `python -m tests.harness.spool_crash_child DIR SPEC` (SPEC is JSON, see `KillPoint`). It submits
`submission(i)` for i = 0, 1, 2, ... through `SpoolWriter` with a window of submissions in flight, and prints
"i seq" the moment submission i's future resolves: what it printed was acknowledged. The kill is a real
kill -9 of this process, taken at the `nth` call of `call` (os.fdatasync, os.fsync or os.pwrite) on a file
whose name ends with `target` ("/" for a directory): before the call, after it returned, or (pwrite) after
writing only the first `fraction` of the buffer. The spool's modules call these through `os.` at run
time, so wrapping them here is wrapping the engine's own system calls; nothing else is changed.

With `close_after`, it closes the writer and the spool after that many submissions (the kill can then come
inside the checkpoint `close` writes). If it gets through without reaching its kill point it exits 3, which
the test reports.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading

from pairmq.appliance.spool import ops as o

CLIENT = "sub"


def submission(i: int) -> list[o.Op]:
    """The i-th submission: a QoS 2 message stored and queued (one MessageRouted, as the broker routes it, or
    every third one as MessageStored and MessageQueued); earlier ones sent, PUBREC'd and completed."""
    if i == 0:
        return [o.SessionOpened(CLIENT, 5, 3600, 1)]
    payload = b"x" * (50 + i % 200)
    ops: list[o.Op]
    if i % 3 == 0:
        ops = [o.MessageStored(i, "t", payload, 2, False, b"", 0, "p", i), o.MessageQueued(CLIENT, i, 2, False)]
    else:
        ops = [o.MessageRouted(i, "t", payload, 2, False, b"", 0, "p", i, CLIENT, 2, False)]
    if i > 2:
        ops.append(o.MessageInflight(CLIENT, i - 2, (i - 2) % 65535 + 1))
    if i > 4:
        ops.append(o.MessagePubrecReceived(CLIENT, i - 4))
    if i > 6:
        ops.append(o.MessageAcked(CLIENT, i - 6))  # PUBCOMP: never to be delivered again
    return ops


@dataclasses.dataclass(frozen=True)
class KillPoint:
    call: str  # "fdatasync", "fsync" or "pwrite"
    target: str  # the end of the file's name (".seg", ".seg.new", ".ckpt.new", "/" for the directory)
    nth: int  # the kill comes at the nth such call
    when: str = "before"  # "before" or "after" the call; for pwrite "part": `fraction` of the bytes written
    fraction: float = 0.5
    segment_bytes: int = 8192
    checkpoint_bytes: int = 16384
    keep_ops: int = 100_000  # WriterLimits': small, and checkpoints drop the segments they cover
    window: int = 64  # submissions in flight: how many a group commit holds at most
    max_submissions: int = 50_000
    close_after: int = 0  # if not 0: after this many submissions, close the writer and the spool (its checkpoint)
    first: int = 0  # the first submission's i (a later round continues the stream)
    epoch: int = 1


def _path_of(fd: int) -> str:
    path = os.readlink(f"/proc/self/fd/{fd}")
    return path + "/" if os.path.isdir(path) else path


def arm(point: KillPoint) -> None:
    real = getattr(os, point.call)
    count = 0
    lock = threading.Lock()

    def die(path: str) -> None:
        sys.stderr.write(f"kill -9 at {point.call} #{point.nth} ({point.when}) of {path}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def wrapped(fd, *args):
        nonlocal count
        path = _path_of(fd)
        if not path.endswith(point.target):
            return real(fd, *args)
        with lock:
            count += 1
            hit = count == point.nth
        if not hit:
            return real(fd, *args)
        if point.when == "before":
            die(path)
        if point.when == "part":
            data, offset = args
            real(fd, bytes(data)[:max(1, int(len(data) * point.fraction))], offset)
            die(path)
        result = real(fd, *args)
        die(path)
        return result

    setattr(os, point.call, wrapped)


def main(directory: str, spec: str) -> None:
    from pairmq.appliance.spool.store import Spool
    from pairmq.appliance.spool.writer import SpoolWriter, WriterLimits

    point = KillPoint(**json.loads(spec))
    spool = Spool.open(directory, segment_bytes=point.segment_bytes)
    spool.checkpoint_bytes = point.checkpoint_bytes
    writer = SpoolWriter(spool, WriterLimits(keep_ops=point.keep_ops))
    arm(point)
    window = threading.Semaphore(point.window)

    def acknowledged(i: int):
        def done(future) -> None:
            window.release()
            if future.exception() is None:
                sys.stdout.write(f"{i} {future.result()[-1].last_seq}\n")
                sys.stdout.flush()
        return done

    for i in range(point.first, point.first + (point.close_after or point.max_submissions)):
        window.acquire()
        writer.submit(submission(i), point.epoch).future.add_done_callback(acknowledged(i))
    writer.close()
    spool.close()
    sys.exit(3)


if __name__ == "__main__":
    main(*sys.argv[1:])
