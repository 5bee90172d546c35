"""The seccomp filter the python tool's box runs under: the kernel's system calls a computation
never needs and an escape often does, refused with EPERM.

bubblewrap loads a filter it is given as compiled classic BPF (`bwrap --seccomp FD`); this
module writes that program, a dozen instructions plus one per refused call, so no compiler
library is needed. The calls refused: new namespaces and mounts (a user namespace hands the
code a root of its own to attack the kernel with), tracing and reading other processes,
process file descriptors (pidfd), kernel keyrings, BPF, perf events, userfaultfd, io_uring,
modules, kexec, handles that bypass paths, device nodes, swap and reboot. Everything else the
namespaces, the unprivileged user and the rlimits already contain.

The numbers are x86-64's (`asm/unistd_64.h`); on another architecture `filter_program`
returns None and the box runs without the filter (its other layers are unchanged).
"""

from __future__ import annotations

import errno
import platform
import struct

# x86-64 system call numbers, from the kernel's asm/unistd_64.h.
REFUSED_X86_64 = {
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
    "chroot": 161, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298,
    "userfaultfd": 323, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
    "finit_module": 313, "delete_module": 176, "open_by_handle_at": 304,
    "name_to_handle_at": 303, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
    "mknod": 133, "mknodat": 259, "fanotify_init": 300, "acct": 163, "swapon": 167,
    "swapoff": 168, "reboot": 169, "syslog": 103, "kcmp": 312, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
    "quotactl": 179,
}  # fmt: skip

AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000  # x32 ABI calls carry this bit; refused whole
# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
LOAD_WORD, JUMP_EQ, JUMP_GE, RETURN = 0x20, 0x15, 0x35, 0x06
ALLOW, KILL_PROCESS, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
# Offsets in struct seccomp_data: the call's number, then the architecture.
NR, ARCH = 0, 4


def _op(code: int, k: int, jump_true: int = 0, jump_false: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jump_true, jump_false, k)


def filter_program() -> bytes | None:
    """The compiled filter for this machine, or None where its call numbers are not known."""
    if platform.machine() != "x86_64":
        return None
    numbers = sorted(REFUSED_X86_64.values())
    deny = 5 + len(numbers) + 1  # index of the EPERM return
    program = [
        _op(LOAD_WORD, ARCH),
        _op(JUMP_EQ, AUDIT_ARCH_X86_64, jump_true=1),
        _op(RETURN, KILL_PROCESS),  # a call made in another ABI (i386's int 0x80)
        _op(LOAD_WORD, NR),
        _op(JUMP_GE, X32_BIT, jump_true=deny - 5),
    ]
    for i, number in enumerate(numbers):
        program.append(_op(JUMP_EQ, number, jump_true=deny - (5 + i) - 1))
    program += [_op(RETURN, ALLOW), _op(RETURN, ERRNO | errno.EPERM)]
    return b"".join(program)
