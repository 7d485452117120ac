"""docs/exit-status.md and the code cannot drift: both of its tables are read and compared with
``ExitStatus`` and ``Outcome``, and every status row names the tests that make clusterrun exit
with it (those tests must exist; rows that can be shown without root must have a fast one)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from clusterrun.errors import COMMANDS, ExitStatus, HostStatus, Outcome, Result, exit_status
from clusterrun.remote import disk
from clusterrun.transport import shell

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "exit-status.md"
JOB = "1\u2013255"  # the row of a failed job (an en dash): the root-cause rank's own status

# Every row of the status table -> the tests that exit with it ("module.py::test_name").
EXERCISED_BY: dict[str, list[str]] = {
    "0": ["test_localhost.py::test_localhost_inventory_needs_no_sshd",
          "test_localhost.py::test_check_of_the_localhost_inventory_passes",
          "test_fake_preflight.py::test_check_exits_0_when_every_host_passes"],
    "1": ["test_localhost.py::test_an_internal_error_is_1_with_a_traceback_to_report"],
    "2": ["test_localhost.py::test_a_bad_inventory_is_2_before_anything_is_contacted",
          "test_inventory.py::test_malformed_inventory_is_refused_before_any_ssh",
          "test_preflight_messages.py::"
          "test_a_malformed_known_hosts_is_exit_2_before_any_host_is_contacted",
          "test_cli_usage.py::test_unusable_home_is_one_paragraph_with_the_fix"],
    "3": ["test_localhost.py::test_a_failed_check_is_3_and_names_the_real_interfaces",
          "test_fake_preflight.py::test_check_exits_3_for_a_failed_check",
          "test_fake_preflight.py::test_check_exits_3_not_4_for_a_silent_probe",
          "test_launch.py::test_preflight_failure_starts_nothing",
          "test_host_paths.py::test_a_user_without_a_home_directory_is_told_the_path_and_the_fix"],
    "4": ["test_localhost.py::test_a_refused_ssh_connection_is_4",
          "test_fake_preflight.py::test_check_exits_4_for_an_unreachable_host",
          "test_check.py::test_changed_host_key_is_refused_and_nothing_runs",
          "test_exec.py::test_exec_names_an_unreachable_host",
          "test_srun_steps.py::test_check_says_the_node_without_a_step_is_unreachable",
          "test_slurm_runs.py::test_a_node_srun_cannot_start_a_step_on_is_unreachable"],
    "5": ["reliability/test_host_faults.py::test_a_partitioned_host_is_lost_and_ends_its_own_run",
          "reliability/test_controller_signals.py::test_sigstop_past_the_lease_then_sigcont"],
    "6": ["test_fake_preflight.py::test_launch_exits_6_when_copying_the_code_fails",
          "test_host_paths.py::test_the_copy_names_a_file_in_the_way_of_one_of_its_directories",
          "reliability/test_disk_full.py::"
          "test_a_full_disk_stops_the_run_naming_the_host_and_loses_no_line"],
    "7": ["test_localhost.py::test_a_stall_ended_by_on_stall_stop_is_7",
          "test_stall.py::test_a_stopped_stall_names_the_hung_rank_and_exits_7"],
    JOB: ["test_localhost.py::test_a_failed_job_exits_with_the_root_cause_ranks_own_status",
          "reliability/test_rank_faults.py::test_a_dying_rank_ends_the_run_on_every_host"],
    "124": ["test_localhost.py::test_exec_timeout_is_124_not_unreachable",
            "test_exec.py::test_exec_timeout_ends_the_command_on_every_host"],
    "130": ["test_localhost.py::test_ctrl_c_and_sigterm_stop_the_run_with_their_statuses",
            "reliability/test_controller_signals.py::test_ctrl_c_stops_every_rank_gracefully",
            "test_exec.py::test_ctrl_c_of_exec_ends_the_command_on_every_host"],
    "143": ["test_localhost.py::test_ctrl_c_and_sigterm_stop_the_run_with_their_statuses"],
}
# A node is lost when its network fails mid-run: that takes the namespace cluster (root).
NEEDS_THE_CLUSTER = {"5"}


def table(heading: str) -> list[list[str]]:
    """The rows (cells stripped, backticks removed) of the first table after ``heading``."""
    text = DOC.read_text()
    start = text.index(heading) if heading else 0
    rows = []
    for line in text[start:].splitlines():
        if line.startswith("|"):
            rows.append([c.strip().strip("`") for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert rows and re.fullmatch(r"-+", rows[1][0]), f"no table after {heading!r} in {DOC}"
    return rows[2:]


def status_rows() -> list[str]:
    return [row[0] for row in table("# Exit statuses")]


def test_every_exit_status_is_documented_and_every_documented_one_exists() -> None:
    numbers = {int(s) for s in status_rows() if s.isdigit()}
    assert numbers == {int(s) for s in ExitStatus}
    assert [s for s in status_rows() if not s.isdigit()] == [JOB]


def test_the_commands_column_is_the_codes() -> None:
    documented = {row[0]: tuple(c.strip() for c in row[2].split(",")) for row in
                  table("# Exit statuses")}
    assert {s: documented[s] for s in documented if s.isdigit()} == \
        {str(int(s)): commands for s, commands in COMMANDS.items()}
    # A failed job's own status comes from `launch`, and from the launch `check --smoke` makes.
    assert documented[JOB] == ("check --smoke", "launch")


def test_the_hosts_own_statuses_are_one_table() -> None:
    documented = {int(row[0]) for row in table("## On the hosts")}
    assert documented == {int(s) for s in HostStatus}
    # The shipped programs cannot import errors.py: their constants are held to the table.
    assert disk.STATUS == HostStatus.DISK_FULL == ExitStatus.SYNC
    assert (shell.SETUP_FAILED, shell.ENGINE_MISSING) == (HostStatus.SETUP_FAILED,
                                                          HostStatus.ENGINE_MISSING)


@pytest.mark.parametrize(("result", "status"), [
    (Result(), 0),
    (Result(stopped=True), 143),
    (Result(code=124), 124),
    (Result(cause=Outcome.JOB_FAILED, code=3, stopped=True), 3),
    (Result(cause=Outcome.JOB_FAILED), 1),  # a failed run whose hosts kept no root cause
    (Result(cause=Outcome.JOB_FAILED, code=300), 1),
    (Result(cause=Outcome.NODE_LOST, code=9), 5),
    (Result(cause=Outcome.STALLED), 7),
    (Result(failed_check=True, cause=Outcome.NODE_LOST), 3),
    (Result(unreachable=True, failed_check=True), 4),  # check prefers 4 over 3
    (Result(unreachable=True, code=7), 4),
    (Result(interrupted=2, unreachable=True, code=3), 130),  # Ctrl-C wins, also for exec
    (Result(interrupted=15, cause=Outcome.JOB_FAILED, code=3), 143),
])
def test_the_precedence_is_the_documented_one(result: Result, status: int) -> None:
    assert exit_status(result) == status


def test_every_outcome_is_documented_with_its_status() -> None:
    documented = {row[0]: row[1] for row in table("## Outcomes")}
    in_code = {o.label: (JOB if o is Outcome.JOB_FAILED else str(int(o.status)))
               for o in Outcome}
    assert documented == in_code
    assert set(documented.values()) <= set(status_rows())


@cache
def module_tests(module: str) -> tuple[set[str], bool]:
    """The test functions of a test module, and whether it is marked `cluster` as a whole (the
    reliability suite's conftest marks its modules)."""
    tree = ast.parse((REPO / "tests" / module).read_text())
    names = {node.name for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    marked = any(isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and "cluster" in ast.unparse(node.value) for node in tree.body)
    return names, marked or module.startswith("reliability/")


def test_every_status_row_names_tests_that_exist() -> None:
    assert set(EXERCISED_BY) == set(status_rows())
    for status, node_ids in EXERCISED_BY.items():
        for node_id in node_ids:
            module, _, name = node_id.partition("::")
            assert name in module_tests(module)[0], f"status {status}: no test {node_id}"


@pytest.mark.parametrize("status", sorted(set(EXERCISED_BY) - NEEDS_THE_CLUSTER))
def test_rows_that_need_no_root_have_a_fast_test(status: str) -> None:
    fast = [n for n in EXERCISED_BY[status] if not module_tests(n.partition("::")[0])[1]]
    assert fast, f"status {status} is only exercised by cluster tests"
