"""Confining a worker before any session code runs: network, uid, Landlock, seccomp.

The host sends a plan, on the command line of a spawned worker (``--sandbox JSON``) or in the
fork request of a forked one, and ``confine(plan)`` applies it, in this order:

    {"uid": 61000 | null, "network": true, "landlock": true, "seccomp": true,
     "read": ["/path", ...], "write": ["/path", ...], "cwd": "/dir" | null}

1. ``network: false`` while still root: a new, empty network namespace (only a loopback that
   is down). Without root this layer is the seccomp rule alone.
2. Landlock (while root, so that every path can be opened): reading and executing under the
   fixed system paths below, the interpreter's prefixes and sys.path, and "read"; writing
   under "write" (the worker's own dirs, the checkpoint scratch dir) and /dev/shm. Every
   right the kernel's ABI knows is handled (v1..v7: REFER, TRUNCATE, IOCTL_DEV, and the v6
   scopes: abstract unix sockets and signals), so an older kernel gets the same rules with
   fewer rights. Landlock also keeps the worker from ptrace-like access (/proc/<pid>/mem,
   /proc/<pid>/environ) to any process outside its own domain.
3. ``uid``: no supplementary groups, gid and uid set to it (real, effective and saved), which
   drops every capability. Then "cwd" is entered as that uid; one it may not enter fails.
4. seccomp: a fixed BPF program (x86_64 and aarch64) refusing with EPERM the syscalls a
   session never needs (ptrace, mount, bpf, unshare, keyctl, ...), clone with a namespace
   flag, and with ``network: false`` socket() for AF_INET, AF_INET6 and AF_PACKET; clone3 gets
   ENOSYS so that libc falls back to clone, whose flags the filter can see.

It must run before the process has a second thread: Landlock binds the calling thread only.
``confine`` returns what it applied, for the hello: {"uid", "landlock" (ABI or None),
"seccomp", "network"}.

A clone of session.fork (see cloning) keeps its source's uid and all of the above. Where
Landlock is on, the host gives it a plan of its own, and once started, before any session
code runs in it, ``isolate_clone(plan)`` copies the source's work directory into the clone's
own, then adds a Landlock layer: reading what the worker could read when it was confined
(recorded then, so that a sys.path the session's code changed since grants nothing), writing
only under the clone's own directories, and (ABI 6 and later) signals and abstract unix
sockets scoped to the clone's domain. A layer only narrows: the clone can no longer reach its
source's files, signal it or its siblings, or trace them (/proc/<pid>/mem), while the source,
whose domain holds the clone's, still can. The hello of a clone adds "clone_isolation", the
list of what it is isolated by (empty when it shares its source's principal).

    {"write": ["/path", ...], "cwd": "/dir", "env": [["TMPDIR", "/dir"], ...],
     "copy_from": "/source/work" | null}
"""

import ctypes
import os
import platform
import stat
import struct
import sys

# Read-only everywhere: system files, devices and the parts of /proc and /sys Python reads.
SYSTEM_READ = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/etc/ssl", "/etc/pki", "/etc/ca-certificates", "/etc/localtime", "/etc/timezone",
    "/etc/passwd", "/etc/group", "/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf",
    "/etc/host.conf", "/etc/gai.conf", "/etc/ld.so.cache", "/etc/ld.so.conf",
    "/etc/ld.so.conf.d", "/etc/mime.types", "/etc/matplotlibrc",
    "/proc", "/sys/devices/system/cpu", "/dev/urandom", "/dev/random",
)
# Devices a worker may also write to (subprocess.DEVNULL opens /dev/null read-write).
DEVICES_WRITE = ("/dev/null", "/dev/zero", "/dev/full")
# Read-write besides the host's own list: POSIX semaphores of multiprocessing.
SYSTEM_WRITE = ("/dev/shm",)

_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1, 2, 4, 8
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2
# Rights that apply to a file (the rest apply to directories only).
_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV

applied = None  # what confine() applied to this process, for the hello
_read_rules = []  # what confine() let the worker read, for the layer of a clone

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int
_CLONE_NEWNET = 0x40000000


def confine(plan):
    """Apply `plan` to this process; return what was applied. Raises OSError on failure."""
    global applied, _read_rules
    done = {"uid": None, "landlock": None, "seccomp": False,
            "network": bool(plan.get("network", True))}
    _read_rules = _read_paths(plan.get("read", []))
    # No exec may give privileges back (the host sets it too; a forked child inherits it).
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)), "PR_SET_NO_NEW_PRIVS")
    if not done["network"] and os.geteuid() == 0:
        _check(_libc.unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    if plan.get("landlock"):
        done["landlock"] = _landlock(_read_rules, plan.get("write", []))
    uid = plan.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        done["uid"] = uid
    cwd = plan.get("cwd")
    if cwd is not None:
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise OSError(exc.errno, "the session's uid %s cannot enter its working directory %s: %s"
                          % (uid if uid is not None else os.getuid(), cwd, exc.strerror)) from None
    if plan.get("seccomp"):
        _seccomp(network=done["network"])
        done["seccomp"] = True
    applied = done
    return done


def _check(result, what):
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "%s: %s" % (what, os.strerror(errno)))
    return result


def landlock_abi():
    """The kernel's Landlock ABI version, or 0 when it has none (or it is disabled)."""
    abi = _libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(abi, 0)


def _fs_rights(abi):
    """Every filesystem right the ABI `abi` handles."""
    rights = (1 << 13) - 1  # v1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


def _read_paths(extra):
    """System paths, the interpreter's, sys.path and `extra`: what the worker may read."""
    paths = list(SYSTEM_READ) + list(extra)
    paths += [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable))]
    paths += [entry for entry in sys.path if entry]
    return paths


def isolate_clone(plan):
    """Isolate this clone from its source and siblings as `plan` says (see the module's doc);
    returns what of the source's work directory could not be copied, as (path, reason).
    Raises OSError when the clone cannot be isolated."""
    global applied
    skipped = []
    if plan.get("copy_from"):
        _copy_dir(plan["copy_from"], plan["cwd"], skipped)
    # Landlock binds the calling thread: a thread started before the layer (say, by an
    # at-fork hook of the source's code) would keep the source's reach inside the clone.
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise OSError(_EPERM, "isolate the clone: %d threads run in it before its Landlock "
                      "layer (at-fork hooks of the source's code started them)" % (threads - 1))
    abi = _landlock(_read_rules, plan["write"])
    if abi is None:
        raise OSError(_ENOSYS, "isolate the clone: the kernel has no Landlock")
    os.chdir(plan["cwd"])
    for name, value in plan["env"]:
        os.environ[name] = value
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None  # gettempdir() cached the source's TMPDIR
    isolation = ["files", "ptrace"] + (["signals", "abstract_sockets"] if abi >= 6 else [])
    applied = dict(applied or {}, clone_isolation=isolation)
    return skipped


def shared_clone():
    """Say in the hello that this clone shares its source's principal (no Landlock)."""
    global applied
    if applied is not None:
        applied = dict(applied, clone_isolation=[])


def _copy_dir(source, target, skipped):
    """Copy the directories, regular files (with their modes and times) and symlinks (as
    links) under `source` into the existing `target`, never following a symlink or opening
    anything but a regular file; what fails is appended to `skipped`."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        from_fd = os.open(source, flags)
    except OSError as exc:
        skipped.append((".", exc.strerror))
        return
    try:
        to_fd = os.open(target, flags)
        try:
            _copy_entries(from_fd, to_fd, "", skipped)
        finally:
            os.close(to_fd)
    finally:
        os.close(from_fd)


def _copy_entries(from_fd, to_fd, prefix, skipped):
    """Copy the entries of the directory `from_fd` into `to_fd` (see _copy_dir)."""
    for entry in os.scandir(from_fd):
        name, path = entry.name, prefix + entry.name
        try:
            if entry.is_symlink():
                os.symlink(os.readlink(name, dir_fd=from_fd), name, dir_fd=to_fd)
            elif entry.is_dir(follow_symlinks=False):
                mode = entry.stat(follow_symlinks=False).st_mode
                os.mkdir(name, 0o700, dir_fd=to_fd)
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                inner_from = os.open(name, flags, dir_fd=from_fd)
                try:
                    inner_to = os.open(name, flags, dir_fd=to_fd)
                    try:
                        _copy_entries(inner_from, inner_to, path + "/", skipped)
                        os.chmod(inner_to, stat.S_IMODE(mode))
                    finally:
                        os.close(inner_to)
                finally:
                    os.close(inner_from)
            else:
                _copy_file(name, from_fd, to_fd)
        except OSError as exc:
            skipped.append((path, exc.strerror or str(exc)))


def _copy_file(name, from_fd, to_fd):
    """Copy the regular file `name` of `from_fd` into `to_fd`; anything else is refused."""
    source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=from_fd)
    try:
        info = os.fstat(source)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(_EPERM, "not a regular file, directory or symlink")
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         stat.S_IMODE(info.st_mode), dir_fd=to_fd)
        try:
            while os.sendfile(target, source, None, 1 << 24):
                pass
            os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(target)
    finally:
        os.close(source)


def _landlock(read, write):
    """Restrict this thread's file access with Landlock: read `read` (every path the worker
    may read) and write `write`; return the ABI, None without one."""
    abi = landlock_abi()
    if abi < 1:
        return None
    handled = _fs_rights(abi)
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled, 0, scoped)[:8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _check(_libc.syscall(_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)),
                                   ctypes.c_uint32(0)), "landlock_create_ruleset")
    try:
        read_rights = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
        device_rights = read_rights | _FS_WRITE_FILE | (handled & (_FS_TRUNCATE | _FS_IOCTL_DEV))
        write_rights = handled & ~(1 << 6 | 1 << 11)  # all but MAKE_CHAR and MAKE_BLOCK
        for paths, rights in ((read, read_rights), (DEVICES_WRITE, device_rights),
                              (list(SYSTEM_WRITE) + list(write), write_rights)):
            for path in paths:
                _allow(ruleset, path, rights & handled)
        _check(_libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _allow(ruleset, path, rights):
    """Add a rule granting `rights` beneath `path`; a path that does not exist is skipped."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not os.path.isdir("/proc/self/fd/%d" % fd):
            rights &= _FILE_RIGHTS
        rule = struct.pack("=Qi", rights, fd)
        _check(_libc.syscall(_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, rule,
                             ctypes.c_uint32(0)), "landlock_add_rule %s" % path)
    finally:
        os.close(fd)


# Syscall numbers: (audit arch, {name: number}). aarch64 uses the generic table.
_AUDIT_ARCH_X86_64, _AUDIT_ARCH_AARCH64 = 0xC000003E, 0xC00000B7
_SYSCALLS = {
    "x86_64": (_AUDIT_ARCH_X86_64, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165,
        "umount2": 166, "pivot_root": 155, "bpf": 321, "perf_event_open": 298,
        "kexec_load": 246, "kexec_file_load": 320, "keyctl": 250, "add_key": 248,
        "request_key": 249, "unshare": 272, "setns": 308, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "reboot": 169, "swapon": 167,
        "swapoff": 168, "acct": 163, "userfaultfd": 323, "open_by_handle_at": 304,
        "quotactl": 179, "syslog": 103, "io_uring_setup": 425, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "clone": 56, "clone3": 435, "socket": 41,
    }),
    "aarch64": (_AUDIT_ARCH_AARCH64, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40,
        "umount2": 39, "pivot_root": 41, "bpf": 280, "perf_event_open": 241,
        "kexec_load": 104, "kexec_file_load": 294, "keyctl": 219, "add_key": 217,
        "request_key": 218, "unshare": 97, "setns": 268, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "reboot": 142, "swapon": 224,
        "swapoff": 225, "acct": 89, "userfaultfd": 282, "open_by_handle_at": 265,
        "quotactl": 60, "syslog": 116, "io_uring_setup": 425, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "clone": 220, "clone3": 435, "socket": 198,
    }),
}
_SPECIAL = ("clone", "clone3", "socket")
_CLONE_NAMESPACES = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_AF_INET, _AF_INET6, _AF_PACKET = 2, 10, 17
_EPERM, _ENOSYS = 1, 38

_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16  # low word of args[0] (little-endian)
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def seccomp_program(machine, network):
    """The BPF program for `machine` as a list of (code, jt, jf, k)."""
    arch, numbers = _SYSCALLS[machine]
    deny = _RET_ERRNO | _EPERM

    def refuse_if(value, action):  # two instructions: equal -> return action, else go on
        return [(_JEQ_K, 0, 1, value), (_RET_K, 0, 0, action)]

    program = [(_LD_W_ABS, 0, 0, _OFFSET_ARCH), (_JEQ_K, 1, 0, arch),
               (_RET_K, 0, 0, _RET_KILL_PROCESS), (_LD_W_ABS, 0, 0, _OFFSET_NR)]
    if machine == "x86_64":  # the x32 ABI: none of its numbers are checked below
        program += [(_JGE_K, 0, 1, 0x40000000), (_RET_K, 0, 0, deny)]
    for name, number in sorted(numbers.items()):
        if name not in _SPECIAL:
            program += refuse_if(number, deny)
    program += refuse_if(numbers["clone3"], _RET_ERRNO | _ENOSYS)
    clone = [(_LD_W_ABS, 0, 0, _OFFSET_ARG0), (_JSET_K, 0, 1, _CLONE_NAMESPACES),
             (_RET_K, 0, 0, deny), (_RET_K, 0, 0, _RET_ALLOW)]
    program += [(_JEQ_K, 0, len(clone), numbers["clone"])] + clone
    if not network:
        socket = [(_LD_W_ABS, 0, 0, _OFFSET_ARG0)]
        for family in (_AF_INET, _AF_INET6, _AF_PACKET):
            socket += refuse_if(family, deny)
        socket.append((_RET_K, 0, 0, _RET_ALLOW))
        program += [(_JEQ_K, 0, len(socket), numbers["socket"])] + socket
    program.append((_RET_K, 0, 0, _RET_ALLOW))
    return program


def _seccomp(network):
    """Install the filter on this process (its later threads and children inherit it)."""
    machine = platform.machine()
    if machine not in _SYSCALLS:
        raise OSError(_ENOSYS, "seccomp: no syscall table for %s" % machine)
    program = seccomp_program(machine, network)
    code = b"".join(struct.pack("=HBBI", *instruction) for instruction in program)
    filters = ctypes.create_string_buffer(code, len(code))

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Program(len(program), ctypes.addressof(filters))
    _check(_libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER),
                       ctypes.c_void_p(ctypes.addressof(fprog)), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)), "seccomp")
