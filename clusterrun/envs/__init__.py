"""`environment:`: the same Python environment on every host, from a lock, built offline there.

platforms (what a host's wheels must fit) -> wheels (the controller's cache, filled by pip) ->
sync (the hosts' stores, the master serving the others: serve, uv building; workdirs: where a
host's built environments are) -> verify (the lock's or not) -> view (what the user sees).
"""
