"""The one error type for input a user can fix."""


class BadInput(ValueError):
    """Input the user can fix: CLIs print the message and exit 2 (no traceback). The message
    names the bad value, why it is bad, and what would be right."""
