"""Run a command under the kernel-level parts of the units' sandbox, without systemd as PID 1.

    python tests/harness/unit_sandbox.py SYSCALLS_FILE FAMILIES -- argv...

What systemd would do for MemoryDenyWriteExecute=yes, SystemCallFilter=@system-service,
SystemCallErrorNumber=EPERM and RestrictAddressFamilies=..., done here with the same kernel tools:
- PR_SET_MDWE (Linux >= 6.3, kept across execve): no memory that is or becomes writable and executable
  (systemd uses a seccomp filter for the same rule);
- a seccomp allow-list (libseccomp, as systemd uses): the system calls named in SYSCALLS_FILE (from
  `systemd-analyze syscall-filter @system-service`), every other one fails with EPERM; socket() only for
  the address families in FAMILIES (comma-separated numbers).
Then it execs argv. Capabilities and no_new_privs are dropped by `setpriv` in front of this script.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys

PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4


def scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def deny_write_execute() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        sys.exit("PR_SET_MDWE failed: this kernel (< 6.3?) cannot check MemoryDenyWriteExecute")
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except PermissionError:
        return
    sys.exit("a writable and executable mapping was allowed: MDWE is not in force")


def allow_only(syscalls: list[str], families: list[int]) -> None:
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(scmp_act_errno(errno.EPERM))
    if not ctx:
        sys.exit("seccomp_init failed")
    allowed = 0
    for name in syscalls:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0 or name == "socket":  # not a call on this architecture / filtered by family below
            continue
        allowed += lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, number, 0, None) == 0
    socket_nr = lib.seccomp_syscall_resolve_name(b"socket")
    for family in families:
        cmp = ArgCmp(0, SCMP_CMP_EQ, family, 0)
        if lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, socket_nr, 1, ctypes.byref(cmp)) != 0:
            sys.exit(f"seccomp: cannot allow socket() for family {family}")
    if allowed < 100 or lib.seccomp_load(ctx) != 0:
        sys.exit(f"seccomp: the filter did not load ({allowed} system calls allowed)")


def main(argv: list[str]) -> None:
    syscalls_file, families, dash, *command = argv
    assert dash == "--" and command, __doc__
    deny_write_execute()
    allow_only(open(syscalls_file).read().split(), [int(f) for f in families.split(",")])
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
