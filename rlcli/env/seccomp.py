"""The seccomp filter the python tool's box runs under: the kernel's system calls a computation
never needs and an escape often does, refused with EPERM (`REFUSED_X86_64`, `FAMILIES`).

bubblewrap loads a filter it is given as compiled classic BPF (`bwrap --seccomp FD`); this
module writes that program, a dozen instructions plus one per refused call, so no compiler
library is needed. Everything else the namespaces, the unprivileged user, the bounded tmpfs and
the rlimits already contain. The numbers are x86-64's (`asm/unistd_64.h`); on another
architecture `filter_program` returns None and the box runs without the filter (its other
layers are unchanged).
"""

from __future__ import annotations

import errno
import platform
import struct

# The refused calls' x86-64 numbers, from the kernel's asm/unistd_64.h. The first lines: new
# namespaces and mounts (a user namespace hands the code a root of its own to attack the kernel
# with), tracing and reading other processes, process file descriptors (pidfd), kernel keyrings,
# BPF, perf events, userfaultfd, io_uring, modules, kexec, handles that bypass paths, device nodes,
# swap and reboot.
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
    # no new process or thread: RLIMIT_NPROC counts per real user, and a box started by a user
    # other than root runs as that user, whose count is shared with everything else it runs
    "clone": 56, "fork": 57, "vfork": 58, "clone3": 435,
    # memory outside RLIMIT_AS: memfds, System V shared memory, message queues and semaphores,
    # POSIX message queues, extended attributes (a tmpfs keeps them in kernel memory)
    "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "shmat": 30, "msgget": 68,
    "semget": 64, "mq_open": 240, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190,
    "setxattrat": 463,
    # inotify instances, counted per user: a box started by another user shares that count,
    # and its instances would come out of the trainer's own
    "inotify_init": 253, "inotify_init1": 294,
}  # fmt: skip
# socket and socketpair, allowed only for the address families the network namespace holds
# (checked on their first argument): AF_VSOCK and its like reach past it.
SOCKET_CALLS = (41, 53)
FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}

AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000  # x32 ABI calls carry this bit; refused whole
# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
LOAD_WORD, JUMP_EQ, JUMP_GE, RETURN = 0x20, 0x15, 0x35, 0x06
ALLOW, KILL_PROCESS, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
# Offsets in struct seccomp_data: the call's number, the architecture, and the low word of the
# first argument (args[0] is 64 bits at 16; x86-64 is little-endian, and the kernel reads an
# address family as an int, so the high word does not matter).
NR, ARCH, ARG0_LOW = 0, 4, 16


def filter_program() -> bytes | None:
    """The compiled filter for this machine, or None where its call numbers are not known."""
    if platform.machine() != "x86_64":
        return None
    return _assemble(
        [
            (LOAD_WORD, ARCH),
            (JUMP_EQ, AUDIT_ARCH_X86_64, 1),
            (RETURN, KILL_PROCESS),  # a call made in another ABI (i386's int 0x80)
            (LOAD_WORD, NR),
            (JUMP_GE, X32_BIT, "deny"),
            *[(JUMP_EQ, number, "socket") for number in SOCKET_CALLS],
            *[(JUMP_EQ, number, "deny") for number in sorted(REFUSED_X86_64.values())],
            (RETURN, ALLOW),
            "socket",
            (LOAD_WORD, ARG0_LOW),
            *[(JUMP_EQ, family, "allow") for family in sorted(FAMILIES.values())],
            "deny",
            (RETURN, ERRNO | errno.EPERM),
            "allow",
            (RETURN, ALLOW),
        ]
    )


def _assemble(lines: list) -> bytes:
    """Classic BPF from `(code, k[, jump if true])` tuples and label strings: a jump is a
    count of instructions to skip or a label further down (BPF jumps only forward), and it
    falls through to the next instruction when false."""
    ops = [line for line in lines if not isinstance(line, str)]
    labels, at = {}, 0
    for line in lines:
        if isinstance(line, str):
            labels[line] = at
        else:
            at += 1
    program = []
    for i, (code, k, *jump) in enumerate(ops):
        skip = 0
        if jump:
            skip = jump[0] if isinstance(jump[0], int) else labels[jump[0]] - i - 1
        assert 0 <= skip < 256, "a BPF jump is one byte"
        program.append(struct.pack("=HBBI", code, skip, 0, k))
    return b"".join(program)
