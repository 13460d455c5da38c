"""Decoding a process's exit status: POSIX signals and Windows NTSTATUS codes.

A process that dies by a POSIX signal has a negative ``returncode`` in
`subprocess` (``-11`` for ``SIGSEGV``).  On Windows a process killed by an
exception exits with the exception's NTSTATUS as its exit code, which
`subprocess` reports unsigned (``3221225477``) or, from some APIs and shells,
signed (``-1073741819``); both decode to ``STATUS_ACCESS_VIOLATION 0xC0000005``.
The C runtime's ``abort()`` makes a Windows process exit with code ``3``.
"""

from __future__ import annotations

import signal as _signal
import sys
from typing import NamedTuple, Optional

#: The platform whose conventions decode an exit status; tests patch it to decode
#: Windows-only codes (the ``abort()`` exit code 3) on another system.
PLATFORM = sys.platform


class NtStatus(NamedTuple):
    """A decoded Windows exit status.

    Attributes:
        code: the status as an unsigned 32-bit number (``0xC0000005``).
        name: the symbolic name (``"STATUS_ACCESS_VIOLATION"``); for a code not in exitsafe's table,
            ``"NTSTATUS"`` followed by its hex value.
        description: what it usually means at exit, in a few words.
    """

    code: int
    name: str
    description: str

    @property
    def hex(self) -> str:
        """The code as eight upper-case hex digits, ``0xC0000005``."""
        return f"0x{self.code:08X}"

    def __str__(self) -> str:
        return f"{self.name} {self.hex}"


#: The C runtime's exit code for ``abort()`` on Windows (not an NTSTATUS, reported as one).
WINDOWS_ABORT_EXIT_CODE = 3

_NTSTATUS: dict[int, tuple[str, str]] = {
    WINDOWS_ABORT_EXIT_CODE: ("ABORT_EXIT_CODE", "abort() was called: the C runtime exits with 3"),
    0x40000015: ("STATUS_FATAL_APP_EXIT", "fatal application exit, often abort()"),
    0x80000003: ("STATUS_BREAKPOINT", "a breakpoint or debug assertion was hit"),
    0xC0000005: ("STATUS_ACCESS_VIOLATION", "invalid memory access, the Windows segfault"),
    0xC0000006: ("STATUS_IN_PAGE_ERROR", "a mapped page could not be read in"),
    0xC0000008: ("STATUS_INVALID_HANDLE", "an invalid handle was used"),
    0xC000000D: ("STATUS_INVALID_PARAMETER", "the C runtime rejected a parameter"),
    0xC0000017: ("STATUS_NO_MEMORY", "out of memory"),
    0xC000001D: ("STATUS_ILLEGAL_INSTRUCTION", "illegal instruction"),
    0xC000008C: ("STATUS_ARRAY_BOUNDS_EXCEEDED", "array bounds exceeded"),
    0xC0000094: ("STATUS_INTEGER_DIVIDE_BY_ZERO", "integer division by zero"),
    0xC0000096: ("STATUS_PRIVILEGED_INSTRUCTION", "privileged instruction"),
    0xC00000FD: ("STATUS_STACK_OVERFLOW", "stack overflow"),
    0xC0000135: ("STATUS_DLL_NOT_FOUND", "a required DLL was not found"),
    0xC0000139: ("STATUS_ENTRYPOINT_NOT_FOUND", "a DLL entry point was not found"),
    0xC000013A: ("STATUS_CONTROL_C_EXIT", "ended by Ctrl+C"),
    0xC0000142: ("STATUS_DLL_INIT_FAILED", "a DLL's initialization, its DllMain, failed"),
    0xC0000374: ("STATUS_HEAP_CORRUPTION", "heap corruption: a double free or use after free"),
    0xC0000409: (
        "STATUS_STACK_BUFFER_OVERRUN",
        "fail-fast exception: stack buffer overrun, or abort() / __fastfail",
    ),
    0xC0000420: ("STATUS_ASSERTION_FAILURE", "an assertion failed"),
}


def decode_signal(returncode: Optional[int]) -> Optional[str]:
    """The name of the POSIX signal that killed a process (`"SIGSEGV"`), else `None`.

    Args:
        returncode: the exit status as `subprocess` reports it.  Only a negative value whose
            magnitude is a signal number decodes: a shell's `128 + N` convention is ambiguous
            with a real exit status and is left alone.

    Returns:
        The signal's name; `"SIG<N>"` for a number this system has no name for; `None`
            when the process was not killed by a signal.
    """
    if returncode is None or returncode >= 0 or PLATFORM == "win32":
        return None
    number = -returncode
    if number > 128:  # a signed NTSTATUS, not a signal
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def decode_ntstatus(returncode: Optional[int]) -> Optional[NtStatus]:
    """The Windows status a process ended with, or `None`.

    Codes with the NTSTATUS error severity (`0xC...`) decode on any platform, since no POSIX
    exit status is that large; an unknown one is named `NTSTATUS_0x...`.  The warning and
    informational codes in exitsafe's table, and `abort()`'s exit code 3, decode only on
    Windows.

    Args:
        returncode: the exit status, unsigned (`3221225477`) or signed (`-1073741819`).

    Returns:
        The decoded status, or `None`.
    """
    if returncode is None or returncode == 0:
        return None
    if returncode < 0 and -returncode <= 128 and PLATFORM != "win32":
        return None  # a POSIX signal
    code = returncode & 0xFFFFFFFF
    known = _NTSTATUS.get(code)
    if code >= 0xC0000000:
        if known is None:
            return NtStatus(code, f"NTSTATUS_0x{code:08X}", "unknown error status")
        return NtStatus(code, known[0], known[1])
    if known is not None and PLATFORM == "win32":
        return NtStatus(code, known[0], known[1])
    return None


def describe_exit(returncode: Optional[int]) -> str:
    """A few words for an exit status: `"SIGSEGV (signal 11)"`,
    `"STATUS_ACCESS_VIOLATION 0xC0000005"`, `"exit status 1"`.

    Args:
        returncode: the exit status as `subprocess` reports it.

    Returns:
        The description.
    """
    if returncode is None:
        return "still running"
    name = decode_signal(returncode)
    if name is not None:
        return f"{name} (signal {-returncode})"
    status = decode_ntstatus(returncode)
    if status is not None:
        return f"{status} ({status.description})"
    return f"exit status {returncode}"
