"""The one error type for input a user can fix, and how every CLI ends on an exception."""
import os


class BadInput(ValueError):
    """Input the user can fix: CLIs print the message and exit 2 (no traceback). The message
    names the bad value, why it is bad, and what would be right."""


def exit_code(exc: BaseException, report) -> int:
    """What every CLI does with an exception that ends it: one line through ``report``, no
    traceback (``SPECTRUM_DEBUG=1`` re-raises for one), and the exit code: 2 for bad input,
    130 when interrupted, 1 for any other failure. Exits and generator closes pass through."""
    if isinstance(exc, BadInput):
        report(f"error: {exc}")
        return 2
    if isinstance(exc, KeyboardInterrupt):
        report("interrupted")
        return 130
    if not isinstance(exc, Exception) or os.environ.get("SPECTRUM_DEBUG"):
        raise exc
    report(f"failed: {exc}")
    return 1
