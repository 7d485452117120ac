"""clusterrun's host side: what runs on the hosts, by the host's own Python (3.6+, standard
library only), and the rules both ends share. Each room is a folder:

- ``shared/``: the only room the controller (clusterrun/ outside remote/) may import. The wire
  (protocol), the run folder's layout and its files' names, the node's state.json (nodestate:
  its field table, one writer, one reader; jsonfile writes it whole), timing gates, and the
  rules both ends apply: the stall rule (stallrule) and report (stallreport), where a stack
  waits (stackrule), the users' own frames (userframe), the Flight Recorder's reading
  (flight), the link test's verdict (linkrule), the disk floor (diskfloor), a file's size
  and SHA-256 as `pull` lists and checks it (filedigest). Typed (mypy checks
  the controller's calls into it). It imports nothing else from remote/.
- ``hostlib/``: what the host programs share and the controller never runs: their files and
  stdout writer (hostio), processes (procs), cgroups, the selectors loop (mainloop), the ranks'
  processes and py-spy stacks (pystack), asking the Flight Recorder for dumps (flightpipe).
- ``node/``: the supervisor, program ``run.py``, and what only it uses: the gang, how ranks are
  started (spawn), and its watchers (watchbase, lineup: progress, stallwatch and its roles
  stallhub, stallreach, stallpeer, flightwatch, linkwatch, nccllog, diskwatch).
- ``probe/``: preflight's facts: programs ``probe.py`` and ``files.py`` (the copy's manifest),
  and the facts they read (sysinfo, nvidia, meshtest, throughput, pathcheck, envstate,
  sitedirs).
- ``tools/``: the one-shot programs the controller's commands run: ``status.py``, ``stop.py``,
  ``tail.py``, ``stackdump.py`` (with profiler), ``sampler.py``, ``linkcheck.py``,
  ``toolcache.py``, ``command.py``, ``pyenv.py``, ``wheelserve.py``, ``outputs.py``.

Rooms import downwards only: shared/ <- hostlib/ <- probe/ <- node/, tools/ (the supervisor and
the tools use probe/'s link test, nvidia-smi reading and environment state; tools/ never
imports node/). A program is asked for by its file name
(``programs.call(..., "pyenv.py", ...)``), unique across the rooms, and is shipped with the
modules its imports name (transport/bundle.py). tests/test_architecture.py holds this plan.
"""
