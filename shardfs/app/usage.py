"""``UsageError``: what the command line reports as one line (``shardfs: error: ...``)."""


class UsageError(Exception):
    """A problem with the user's input, reported as one line."""
