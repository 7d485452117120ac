"""A process's exit status in words, the same on both ends (stdlib only, Python 3.6+): the node's
supervisor reports a rank's end with it (node/run.py), the controller its root cause
(launch/outcome.py)."""

import signal


def describe(code: int) -> str:
    """`exited with code 1`, `was killed by signal 9 (SIGKILL)`: a shell's 128 + N is signal N."""
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            return "exited with code %d" % code
        return "was killed by signal %d (%s)" % (code - 128, name)
    return "exited with code %d" % code
