"""The warm session: a per-user daemon, started on demand, that keeps one SSH connection and one
resident agent (remote/tools/hostagent.py) per host across commands, and the thin client that
commands reach it through (docs/how-it-works.md, "The warm session").

- ``paths``: where its socket, lock and log live, and whether it is on;
- ``hostlink``: one host's connection and agent, in the daemon;
- ``daemon``: the daemon: the socket, its peers' uid, relaying frames, idle exit;
- ``client``: ``SessionTransport``, a Transport over the daemon's socket, and starting it.
"""
