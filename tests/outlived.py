"""Runs a command (tests/run: the test suite) and fails if any process it
started outlives it.

This process makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER):
a process whose parent exits is re-parented to it instead of to init. Once
the command has exited, every process still a child of this one was started
by the command, directly or not, and left running: such as the nginx
workers of a master killed with SIGKILL. Each is named (pid and command
line), stopped (SIGTERM, then SIGKILL), and the run fails. Orphans that
exit while the command runs are reaped as they go.

usage: python3 tests/outlived.py COMMAND [ARG...]
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
# A process the suite stopped just before it exited may take a moment to
# go; one still running after this long was left running.
GRACE_S = 10


def children():
    """The pids of this process's live (not zombie) children."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == me and state != "Z":
            out.append(int(name))
    return out


def reap():
    """Reaps every child that has exited; never blocks."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.rsplit("usage: ", 1)[1].strip())
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        sys.exit(f"tests/outlived.py: prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")
    command = subprocess.Popen(sys.argv[1:])
    # Ctrl-C reaches the command from the terminal; this process stays to
    # check what it leaves.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status = None
    while status is None:
        pid, raw = os.waitpid(-1, 0)
        if pid == command.pid:
            status = os.waitstatus_to_exitcode(raw)
    deadline = time.monotonic() + GRACE_S
    reap()
    while children() and time.monotonic() < deadline:
        time.sleep(0.1)
        reap()
    code = status if status >= 0 else 128 - status
    left = children()
    if not left:
        sys.exit(code)
    print(
        f"tests/outlived.py: {len(left)} process(es) the tests started outlived them "
        "(a test must stop what it starts, and wait for it):",
        file=sys.stderr,
    )
    for pid in left:
        print(f"  {pid}: {cmdline(pid)}", file=sys.stderr)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in children():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(1)
        reap()
    sys.exit(code or 1)


if __name__ == "__main__":
    main()
