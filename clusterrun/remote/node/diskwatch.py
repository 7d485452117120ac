"""The supervisor's watch on the free space under its run directory (stdlib only, Python 3.6+):
the floor and the words are remote/shared/diskfloor.py's, which preflight checks against too."""

from clusterrun.remote.shared import diskfloor, timing

# Looking at every 0.1 s tick of the supervisor (statvfs costs microseconds).
EVERY = 0.1


class Watch:
    """``check(now)``: None while there is room, then (once) what to tell the user."""

    def __init__(self, path, floor=diskfloor.FLOOR, every=EVERY):
        self.path = path
        self.floor = floor
        self.every = every
        self.next = 0.0
        self.told = False

    def check(self, now):
        if self.told or now < self.next - timing.SLACK:  # due at next, rounding aside
            return None
        self.next = now + self.every
        free = diskfloor.free_bytes(self.path)
        if free is None or free >= self.floor:
            return None
        self.told = True
        return ("disk nearly full under %s (%s free, runs stop below %s): free space there "
                "or set `workdir:` to a larger disk" % (
                    self.path, diskfloor.size_text(free), diskfloor.size_text(self.floor)))
