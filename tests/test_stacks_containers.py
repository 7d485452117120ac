"""`clusterrun stacks` on `container:` hosts (real podman in the namespace hosts): with
`--cap-add SYS_PTRACE` the ranks' stacks are read inside the container; without it `check`
warns, naming the host and the fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    Cluster,
    Containers,
    copy_payload,
    detach_hung_in_containers,
    run_cli,
)
from tests.support import containers as engine

pytestmark = pytest.mark.cluster

HOSTS = ["node30", "node31"]
TRACING, PLAIN = "tracer", "plain"


@pytest.fixture
def boxes(cluster: Cluster, containers: Containers) -> Iterator[None]:
    for host in HOSTS:
        for name in (TRACING, PLAIN):
            engine.remove(cluster.sb, host, name)
        engine.run(cluster.sb, host, TRACING, options=["--cap-add", "SYS_PTRACE"])
        engine.run(cluster.sb, host, PLAIN)
    yield
    for host in HOSTS:
        for name in (TRACING, PLAIN):
            engine.remove(cluster.sb, host, name)


def test_stacks_in_containers_and_checks_warning(cluster: Cluster, boxes: None, home: Path,
                                                tmp_path: Path) -> None:
    plain = cluster.inventory(tmp_path / "plain.yaml", HOSTS, defaults={"container": PLAIN})
    cp = run_cli("check", str(plain))
    out = " ".join(cp.stdout.split())
    # Both hosts, folded into one line: node[30-31]: stacks: warning: ... the fix.
    assert ("node[30-31]: stacks: warning: `clusterrun stacks` and the stall report cannot read "
            "the ranks' stacks there: the container lacks CAP_SYS_PTRACE") in out, out
    assert "--cap-add SYS_PTRACE" in out, out

    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS, defaults={"container": TRACING})
    script = copy_payload(tmp_path, "hang.py")
    run_id, ranks = detach_hung_in_containers(inv, script)
    odd = {r["rank"]: r for r in ranks}[2]
    assert odd["node"] == "node31"
    assert run_cli("stop", "--grace", "2", run_id).returncode == 0
    assert cluster.wait_run_gone(HOSTS, run_id, 30) == {}
