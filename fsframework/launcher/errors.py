"""The one error type of the launcher: a user-facing message, shown without a traceback."""


class LaunchError(ValueError):
    """Launch options, hostfile or environment cannot start this job."""
