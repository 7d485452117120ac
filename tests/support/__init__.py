"""What the tests add to the sandbox cluster (clusterrun.sandbox): a real Slurm (slurm), podman and
docker engines inside its hosts (containers, docker), normal users (users) and crashed hosts
(faults).

They live here, not in clusterrun/sandbox/, because only the test suite and the benchmarks use
them: the wheel users install ships what `clusterrun sandbox up|down` needs and nothing more.
The sandbox's state file still records what these start (clusterrun/sandbox/state.py), so that
`sandbox.down()` ends it whoever started it.
"""
