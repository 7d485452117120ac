"""GPU preflight without GPUs: nvidia-smi's CSV as real drivers print it, the verdicts drawn from
it, and the fake nvidia-smi (tests/fakes/) answering the real probe through the local transport.
With a real process of another user, on the namespace cluster: test_gpu_preflight.py."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clusterrun.errors import ExitStatus
from clusterrun.preflight import gpus as judge
from clusterrun.preflight.facts import HostFacts
from clusterrun.preflight.probe_session import ProbeSession
from clusterrun.preflight.report import HostReport
from clusterrun.remote.probe import nvidia as probe
from clusterrun.transport.local import LocalTransport
from tests.conftest import LOCAL_SPEC, host_spec, run_cli, write_inventory

FAKES = Path(__file__).resolve().parent / "fakes"
FAKE_SMI = FAKES / "nvidia-smi"

# --- parsing: output captured in the shape drivers print it ----------------------------------

GPU_CSV = """\
0, GPU-5b1f3a52-8c2e-4f7e-9d1b-0a1b2c3d4e5f, NVIDIA H100 80GB HBM3, 550.54.15, 4, 81559, Default
1, GPU-6c2a4b63-9d3f-5a8f-ae2c-1b2c3d4e5f60, NVIDIA H100 80GB HBM3, 550.54.15, 81000, 81559, \
Exclusive_Process
2, GPU-7d3b5c74-ae4a-6b9a-bf3d-2c3d4e5f6071, NVIDIA RTX A6000, Rev. 2, 550.54.15, [N/A], \
[N/A], [Not Supported]
"""
ECC_CSV = "0, 0, No\n1, 2, Yes\n2, [N/A], [N/A]\n"
REMAP_CSV = """\
GPU-5b1f3a52-8c2e-4f7e-9d1b-0a1b2c3d4e5f, 0, 0
GPU-6c2a4b63-9d3f-5a8f-ae2c-1b2c3d4e5f60, Yes, No
GPU-7d3b5c74-ae4a-6b9a-bf3d-2c3d4e5f6071, [N/A], [N/A]
"""


def test_gpu_rows_parse_with_unknowns_and_commas_in_names() -> None:
    gpus = probe.parse_gpus(GPU_CSV)
    assert [g["index"] for g in gpus] == [0, 1, 2]
    assert gpus[0] == {"index": 0, "uuid": "GPU-5b1f3a52-8c2e-4f7e-9d1b-0a1b2c3d4e5f",
                       "name": "NVIDIA H100 80GB HBM3", "driver": "550.54.15",
                       "memory_used": 4, "memory_total": 81559, "compute_mode": "Default",
                       "ecc_uncorrected": None, "retired_pages_pending": None,
                       "remap_pending": None, "remap_failure": None}
    assert gpus[1]["compute_mode"] == "Exclusive_Process"
    # A comma inside the name column does not shift the columns after it.
    assert gpus[2]["name"] == "NVIDIA RTX A6000, Rev. 2"
    assert gpus[2]["driver"] == "550.54.15"
    assert (gpus[2]["memory_used"], gpus[2]["memory_total"], gpus[2]["compute_mode"]) == (
        None, None, None)

    probe.parse_ecc(ECC_CSV, gpus)
    probe.parse_remaps(REMAP_CSV, gpus)
    assert [(g["ecc_uncorrected"], g["retired_pages_pending"]) for g in gpus] == [
        (0, False), (2, True), (None, None)]
    # Drivers print the remap flags as 0/1 or No/Yes; [N/A] on GPUs without a row remapper.
    assert [(g["remap_pending"], g["remap_failure"]) for g in gpus] == [
        (False, False), (True, False), (None, None)]


def test_cells_that_say_unknown_are_none() -> None:
    for text in ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]",
                 "[Insufficient Permissions]", "", "  "):
        assert probe.value(text) is None, text
        assert probe.number(text) is None, text
        assert probe.flag(text) is None, text
    assert probe.number("1000 MiB") == 1000
    assert (probe.flag("Yes"), probe.flag("No"), probe.flag("1"), probe.flag("0")) == (
        True, False, True, False)


def test_apps_are_mapped_to_their_gpu_and_owner() -> None:
    gpus = probe.parse_gpus(GPU_CSV)
    unseen = 2**22 + 7  # above the largest pid_max Linux allows: never a live process
    apps_csv = (f"GPU-6c2a4b63-9d3f-5a8f-ae2c-1b2c3d4e5f60, {os.getpid()}, 80990, python, x\n"
                f"GPU-5b1f3a52-8c2e-4f7e-9d1b-0a1b2c3d4e5f, {unseen}, [N/A], [N/A]\n")
    mine, hidden = probe.parse_apps(apps_csv, gpus)
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert mine == {"gpu": 1, "gpu_uuid": "GPU-6c2a4b63-9d3f-5a8f-ae2c-1b2c3d4e5f60",
                    "pid": os.getpid(), "used_memory": 80990, "process_name": "python, x",
                    "uid": os.geteuid(), "user": me, "visible": True, "mine": True}
    assert hidden["gpu"] == 0 and hidden["used_memory"] is None
    assert (hidden["visible"], hidden["user"], hidden["mine"]) == (False, None, None)


def test_a_hanging_nvidia_smi_costs_its_timeout_not_the_probe(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stuck = tmp_path / "nvidia-smi"
    # An hour: a probe that waited for it would run into pytest's own timeout, not pass.
    stuck.write_text("#!/bin/sh\nexec sleep 3600\n")
    stuck.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out, error = probe.nvidia_smi(["-L"], timeout=1)
    assert out is None and error == "nvidia-smi gave no answer within 1 s"


# --- verdicts -----------------------------------------------------------------------------


def gpu(index: int, **over: Any) -> dict[str, Any]:
    base = {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100 80GB HBM3",
            "driver": "550.54.15", "memory_used": 4, "memory_total": 81559,
            "compute_mode": "Default", "ecc_uncorrected": 0, "retired_pages_pending": False,
            "remap_pending": False, "remap_failure": False}
    return {**base, **over}


def app(on: int, pid: int, user: str = "nobody", mib: int = 1000, **over: Any) -> dict[str, Any]:
    base = {"gpu": on, "gpu_uuid": f"GPU-{on}", "pid": pid, "used_memory": mib,
            "process_name": "python", "uid": 65534, "user": user, "visible": True,
            "mine": False}
    return {**base, **over}


def gpu_facts(*gpus: dict[str, Any], apps: tuple[dict[str, Any], ...] = (),
              driver: str = "550.54.15", **nvidia: Any) -> dict[str, Any]:
    found = {"smi": "/usr/bin/nvidia-smi", "count": len(gpus), "driver": driver,
             "gpus": list(gpus), "apps": list(apps), "errors": {}, **nvidia}
    return {"gpus": found["count"], "nvidia": found}


def verdicts(facts: dict[str, Any], allow: bool = False,
             **spec: Any) -> dict[str, tuple[bool, str]]:
    checks = judge.host_checks(host_spec("gpu-a", **spec), HostFacts.from_json(facts),
                               allow_busy_gpus=allow)
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), names  # one check per kind of problem
    return {c.name: (c.ok, c.detail) for c in checks}


def test_idle_gpus_pass_with_a_summary() -> None:
    found = verdicts(gpu_facts(*(gpu(i) for i in range(4))))
    assert found == {"gpus": (True, "4 of 4 GPU(s) used (all), NVIDIA H100 80GB HBM3, "
                                    "driver 550.54.15")}
    found = verdicts(gpu_facts(*(gpu(i) for i in range(4))), gpus=(1, 2))
    assert found["gpus"][1].startswith("2 of 4 GPU(s) used (1, 2)")


def test_another_users_process_fails_naming_host_gpu_user_and_fix() -> None:
    facts = gpu_facts(gpu(0, memory_used=1004), gpu(1), apps=(app(0, 4242, mib=1000),))
    ok, detail = verdicts(facts)["gpu_busy"]
    assert not ok
    assert detail.startswith("gpu-a GPU 0: 1004 MiB of 81559 MiB in use by pid 4242 python "
                             "(1000 MiB) of user nobody.")
    assert "run out of memory at start-up, or hang in NCCL init" in detail
    assert detail.endswith("Stop those processes, pick other GPUs with `gpus:` in the "
                           "inventory, or pass --allow-busy-gpus to go on.")

    ok, detail = verdicts(facts, allow=True)["gpu_busy"]
    assert ok and detail.startswith("warning: gpu-a GPU 0: 1004 MiB")
    assert detail.endswith("Going on anyway (--allow-busy-gpus).")


def test_only_the_gpus_this_run_uses_are_judged() -> None:
    facts = gpu_facts(*(gpu(i) for i in range(8)), apps=(app(5, 4242),))
    assert "gpu_busy" in verdicts(facts)
    assert "gpu_busy" not in verdicts(facts, gpus=(0, 1))
    # nproc_per_node 2 on 8 GPUs: local ranks 0 and 1 take cuda:0 and cuda:1.
    assert "gpu_busy" not in verdicts(facts, nproc_per_node=2)
    assert "gpu_busy" in verdicts(facts, nproc_per_node=6)


def test_own_unknown_and_invisible_users_are_told_apart() -> None:
    mine = app(0, 77, user="alice", mine=True, uid=1000)
    hidden = app(1, 88, user=None, uid=None, visible=False, mine=None, used_memory=None)
    ok, detail = verdicts(gpu_facts(gpu(0), gpu(1), apps=(mine, hidden)))["gpu_busy"]
    # A process of the user clusterrun runs as still fails: the memory is gone all the same.
    assert not ok
    assert ("GPU 0: 4 MiB of 81559 MiB in use by pid 77 python (1000 MiB) of alice, the user "
            "clusterrun runs as there: a leftover of an earlier run? `kill 77`") in detail
    assert ("GPU 1: 4 MiB of 81559 MiB in use by pid 88 python (memory unknown) of an unknown "
            "user: that pid is not visible on the host (another PID namespace, such as a "
            "container)") in detail


def test_memory_in_use_without_a_visible_process() -> None:
    ok, detail = verdicts(gpu_facts(gpu(0, memory_used=30000)))["gpu_busy"]
    assert not ok and ("gpu-a GPU 0: 30000 MiB of 81559 MiB in use, by no process nvidia-smi "
                       "shows here (another container or PID namespace)") in detail
    # What an idle GPU or a desktop's X server holds is not a job.
    assert "gpu_busy" not in verdicts(gpu_facts(gpu(0, memory_used=judge.BUSY_MIB)))


def test_compute_modes() -> None:
    found = verdicts(gpu_facts(gpu(0, compute_mode="Exclusive_Process"),
                               gpu(1, compute_mode="Prohibited"), gpu(2, compute_mode=None)))
    ok, detail = found["gpu_mode"]
    assert not ok
    assert detail.startswith("gpu-a GPU 0 is in compute mode Exclusive_Process; GPU 1 is in "
                             "compute mode Prohibited: ")
    assert "all CUDA-capable devices are busy or unavailable" in detail
    assert "GPU 2" not in detail  # unknown (an old driver) is not a failure
    assert "`nvidia-smi -i 0,1 -c DEFAULT`" in detail
    assert verdicts(gpu_facts(gpu(0, compute_mode="Prohibited")), allow=True)["gpu_mode"][0]


def test_ecc_errors_and_pending_repairs() -> None:
    found = verdicts(gpu_facts(gpu(0, ecc_uncorrected=3), gpu(1, retired_pages_pending=True),
                               gpu(2, remap_pending=True), gpu(3, remap_failure=True),
                               gpu(4, ecc_uncorrected=None, remap_pending=None)))
    ok, detail = found["gpu_health"]
    assert not ok
    assert detail.startswith("gpu-a GPU 0: 3 uncorrected ECC error(s) since the driver loaded; "
                             "GPU 1: memory pages pending retirement; GPU 2: a row remapping "
                             "pending; GPU 3: a failed row remapping.")
    assert "GPU 4" not in detail
    assert "`nvidia-smi -r -i 0,1,2,3`" in detail
    assert verdicts(gpu_facts(gpu(0, ecc_uncorrected=3)), allow=True)["gpu_health"][0]


def test_gpu_count_against_gpus_and_nproc_per_node() -> None:
    facts = gpu_facts(gpu(0), gpu(1))
    ok, detail = verdicts(facts, gpus=(0, 3))["gpu_count"]
    assert not ok and detail.startswith("`gpus: [0, 3]` but gpu-a has 2 GPU(s) (indices 0-1): "
                                        "GPU 3 does not exist")
    assert detail.endswith("Fix `gpus:` for that host.")
    ok, detail = verdicts(facts, allow=True, gpus=(0, 3))["gpu_count"]
    assert ok and detail.startswith("warning: `gpus: [0, 3]`")

    ok, detail = verdicts(facts, nproc_per_node=4)["gpu_count"]
    assert ok and detail.startswith("warning: nproc_per_node 4 but 2 GPU(s) visible on gpu-a")
    ok, detail = verdicts(gpu_facts(*(gpu(i) for i in range(8))), gpus=(0, 1),
                          nproc_per_node=4)["gpu_count"]
    assert ok and detail.startswith("warning: nproc_per_node 4 but 2 GPU(s) visible")
    assert "gpu_count" not in verdicts(facts, nproc_per_node=2)
    assert "gpu_count" not in verdicts(facts, gpus=(1,))


def test_without_nvidia_smi_nothing_fails() -> None:
    none = {"gpus": 0, "nvidia": {"smi": None, "count": 0, "driver": None, "gpus": [],
                                  "apps": [], "errors": {}}}
    assert verdicts(none) == {"gpus": (True, "no NVIDIA GPU found (no nvidia-smi on the PATH)")}
    assert verdicts(none, nproc_per_node=4) == verdicts(none)  # CPU ranks (gloo) are fine
    ok, detail = verdicts(none, gpus=(0, 1))["gpus"]
    assert ok and detail.startswith("warning: `gpus: [0, 1]` but no NVIDIA GPU was found on "
                                    "gpu-a")


def test_a_failing_nvidia_smi_fails_unless_allowed() -> None:
    broken = {"gpus": 8, "nvidia": {"smi": "/usr/bin/nvidia-smi", "count": 8, "driver": None,
                                    "gpus": [], "apps": [], "errors": {
                                        "gpus": "nvidia-smi exited 18: Failed to initialize "
                                                "NVML: Driver/library version mismatch"}}}
    ok, detail = verdicts(broken)["gpus"]
    assert not ok and detail.startswith("nvidia-smi fails on gpu-a (`nvidia-smi -L` lists 8 "
                                        "GPU(s)): nvidia-smi exited 18: Failed to initialize "
                                        "NVML: Driver/library version mismatch.")
    assert "needs a reboot" in detail
    assert verdicts(broken, allow=True)["gpus"][0]


def test_a_query_the_driver_does_not_know_is_named_in_the_summary() -> None:
    facts = gpu_facts(gpu(0, remap_pending=None, remap_failure=None),
                      errors={"remapped_rows": "nvidia-smi exited 2: Field ... not valid"})
    assert verdicts(facts) == {"gpus": (True, "1 of 1 GPU(s) used (all), NVIDIA H100 80GB HBM3, "
                                              "driver 550.54.15; nvidia-smi could not report: "
                                              "remapped rows")}


def test_facts_without_gpu_details_say_unknown_and_still_check_the_count() -> None:
    """Facts that give only the count: nothing about the GPUs' state was read, and the check
    says so rather than passing (a count of 0 is not "no GPU found")."""
    ok, detail = verdicts({"gpus": 0})["gpus"]
    assert ok and detail == ("warning: whether gpu-a has NVIDIA GPUs is unknown: the probe sent "
                             "no nvidia-smi details, so that was not checked (`nvidia-smi` "
                             "there).")
    found = verdicts({"gpus": 1}, gpus=(0, 3))
    ok, detail = found["gpus"]
    assert ok and detail.startswith("warning: 1 of 1 GPU(s) used (0); whether they are free "
                                    "and healthy is unknown")
    assert not found["gpu_count"][0]


def test_drivers_are_compared_with_the_masters() -> None:
    def host(name: str, driver: str | None, master: bool = False) -> HostReport:
        facts = gpu_facts(gpu(0), driver=driver) if driver else {"gpus": 0, "nvidia": {
            "smi": None, "driver": None}}
        return HostReport(host_spec(name, master=master), 0, facts=facts)

    hosts = [host("w1", "535.161.08"), host("m", "550.54.15", master=True),
             host("w2", "550.54.15"), host("cpu", None), HostReport(host_spec("gone"), 4)]
    judge.compare_drivers(hosts)
    w1, m, w2, cpu, gone = ({c.name: c for c in h.checks} for h in hosts)
    assert w1["gpu_driver"].ok
    assert w1["gpu_driver"].detail.startswith("warning: NVIDIA driver 535.161.08 on w1 but "
                                              "550.54.15 on the master m.")
    # The words without the host's name, for the report to say once for every such host.
    assert w1["gpu_driver"].group is not None and "w1" not in w1["gpu_driver"].group
    assert not m and not w2 and not cpu and not gone

    # A master without GPUs (the controller's own machine, say): the first GPU host decides.
    hosts = [host("m", None, master=True), host("a", "550.54.15"), host("b", "535.161.08")]
    judge.compare_drivers(hosts)
    assert "535.161.08 on b but 550.54.15 on a." in hosts[2].checks[0].detail
    assert not hosts[0].checks and not hosts[1].checks


# --- the fake nvidia-smi, and the real probe asking it ------------------------------------


def fake_state(tmp_path: Path, **state: Any) -> Path:
    path = tmp_path / "nvidia-smi.json"
    path.write_text(json.dumps(state))
    return path


def smi(state: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FAKE_SMI), *argv], capture_output=True, text=True, check=False,
                          env={**os.environ, "FAKE_NVIDIA_SMI_STATE": str(state)})


def test_the_fake_refuses_unknown_fields_like_the_real_one(tmp_path: Path) -> None:
    state = fake_state(tmp_path, gpus=[{}, {}], unsupported=["remapped_rows.failure"])
    cp = smi(state, "--query-gpu=index,bogus.field", "--format=csv,noheader")
    assert cp.returncode != 0 and 'Field "bogus.field" is not a valid field' in cp.stdout
    cp = smi(state, "--query-remapped-rows=gpu_uuid,remapped_rows.failure", "--format=csv")
    assert cp.returncode != 0
    cp = smi(state, "--query-gpu=index,memory.used", "--format=csv")
    assert cp.returncode == 0 and cp.stdout.splitlines() == [
        "index, memory.used", "0, 0 MiB", "1, 0 MiB"]
    assert smi(state, "-L").stdout.splitlines()[1].startswith("GPU 1: NVIDIA H100 80GB HBM3 (UUID:")


def probe_facts(state: Path | None, path: str = f"{FAKES}:$PATH") -> dict[str, Any]:
    """The real probe's facts, run as on a host: after a `setup:` that sets its PATH."""
    spec = dataclasses.replace(LOCAL_SPEC, setup=f"export PATH={path} "
                               f"FAKE_NVIDIA_SMI_STATE={state or ''}")
    session = ProbeSession(LocalTransport(spec), spec, 30)
    try:
        return session.facts
    finally:
        session.close()


def test_the_probe_reports_the_fakes_gpus(tmp_path: Path) -> None:
    state = fake_state(tmp_path, driver_version="535.161.08",
                       gpus=[{"memory.used": 1004}, {"compute_mode": "Exclusive_Process",
                                                     "ecc.errors.uncorrected.volatile.total": 2}],
                       apps=[{"gpu": 0, "pid": 1, "used_memory": 1000, "process_name": "init"}],
                       unsupported=["remapped_rows.pending"])
    facts = probe_facts(state)
    nvidia = facts["nvidia"]
    assert facts["gpus"] == 2
    assert nvidia["smi"] == str(FAKE_SMI)
    assert (nvidia["count"], nvidia["driver"]) == (2, "535.161.08")
    assert [(g["index"], g["memory_used"], g["compute_mode"], g["ecc_uncorrected"])
            for g in nvidia["gpus"]] == [(0, 1004, "Default", 0), (1, 0, "Exclusive_Process", 2)]
    # The remapped rows query failed on its own; every other answer is there.
    assert list(nvidia["errors"]) == ["remapped_rows"]
    assert all(g["remap_pending"] is None for g in nvidia["gpus"])
    owner_uid = int(Path("/proc/1/status").read_text().split("Uid:")[1].split()[1])
    [init] = nvidia["apps"]
    assert init == {"gpu": 0, "gpu_uuid": nvidia["gpus"][0]["uuid"], "pid": 1,
                    "used_memory": 1000, "process_name": "init", "uid": owner_uid,
                    "user": pwd.getpwuid(owner_uid).pw_name, "visible": True,
                    "mine": owner_uid == os.geteuid()}


def test_the_probe_without_nvidia_smi(tmp_path: Path) -> None:
    facts = probe_facts(None, path=str(tmp_path))
    assert facts["gpus"] == 0
    assert facts["nvidia"] == {"smi": None, "count": 0, "driver": None, "gpus": [], "apps": [],
                               "errors": {}}


def test_check_names_the_busy_gpu_and_allow_busy_goes_on(home: Path, tmp_path: Path) -> None:
    state = fake_state(tmp_path, gpus=[{"memory.used": 1004}, {}],
                       apps=[{"gpu": 0, "pid": 1, "used_memory": 1000, "process_name": "init"}])
    owner_uid = int(Path("/proc/1/status").read_text().split("Uid:")[1].split()[1])
    owner = pwd.getpwuid(owner_uid).pw_name
    inv = write_inventory(tmp_path / "inv.yaml", [
        {"host": "localhost", "name": "n0", "gpus": [0, 1]},
        {"host": "localhost", "name": "n1", "gpus": [1]}],
        defaults={"python": sys.executable,
                  "setup": f"export PATH={FAKES}:$PATH FAKE_NVIDIA_SMI_STATE={state}"})
    cp = run_cli("check", str(inv), timeout=90)
    assert cp.returncode == ExitStatus.PREFLIGHT, cp.stdout + cp.stderr
    line = next(x for x in cp.stdout.splitlines() if "gpu_busy:" in x)
    assert ("gpu_busy: n0 GPU 0: 1004 MiB of 81559 MiB in use by pid 1 init (1000 MiB) of "
            in line)
    assert owner in line and "--allow-busy-gpus" in line
    assert "n1" not in line and "1 of 2 hosts failed: n0;" in cp.stdout  # n1 uses GPU 1 only

    cp = run_cli("check", "--json", "--allow-busy-gpus", str(inv), timeout=90)
    assert cp.returncode == ExitStatus.SUCCESS, cp.stdout + cp.stderr
    report = json.loads(cp.stdout)
    n0 = {c["name"]: c for c in report["hosts"][0]["checks"]}
    assert n0["gpu_busy"]["ok"] and n0["gpu_busy"]["detail"].startswith(
        "warning: n0 GPU 0: 1004 MiB")
    assert (n0["gpus"]["ok"], n0["gpus"]["detail"]) == (
        True, "2 of 2 GPU(s) used (0, 1), NVIDIA H100 80GB HBM3, driver 550.54.15")
    assert report["hosts"][0]["gpus"] == 2 and report["hosts"][1]["gpus"] == 1
