"""`environment:`: the same Python environment on every host, from a lock, built offline there.

hoststatus (what a host reports, read into types) -> platforms (what a host's wheels must fit)
-> wheels (the controller's cache, filled by pip) -> sync (the hosts' stores, the master serving
the others: serve, uv building; workdirs: where a host's built environments are; hostenv: each
host's environment as the sync finds and leaves it) -> verify (the lock's or not) -> view (what
the user sees). warm: a launch's environments judged from preflight's own facts.
"""
