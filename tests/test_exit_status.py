"""docs/exit-status.md and the code cannot drift: both of its tables are read and compared with
``ExitStatus`` and ``Outcome``. Its "commands" column is what tests show: every command a row
names is run by a named test that asserts the row's status (those tests must exist, must name
the command and must assert on that status; rows that can be shown without root must have a
fast one)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from clusterrun.cli import cli
from clusterrun.errors import ExitStatus, HostStatus, Outcome, Result, exit_status
from clusterrun.remote import disk
from clusterrun.transport import shell
from tests.conftest import run_main

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "exit-status.md"
JOB = "1\u2013255"  # the row of a failed job (an en dash): the root-cause rank's own status
ALL = "all"  # 0, 1 and 2 come from the one entry point (cli.main) whatever the command

UNREACHABLE_RUN = ("test_unreachable_run.py::"
                   "test_a_run_whose_host_cannot_be_reached_exits_4_naming_it")
CHECK_SMOKE_SIGNALS = ("test_localhost.py::"
                       "test_ctrl_c_and_sigterm_stop_check_smoke_with_their_statuses")
PREFLIGHT_SIGNALS = ("test_localhost.py::"
                     "test_a_signal_during_preflight_ends_with_its_status_and_a_word")

# Every row of the status table -> each command the doc names for it -> the tests that run that
# command and see it exit with that status ("module.py::test_name"). The doc's commands column
# is these commands, and NOT_YET_SHOWN's.
EXERCISED_BY: dict[str, dict[str, list[str]]] = {
    "0": {ALL: ["test_exit_status.py::test_every_command_exits_0_and_2_through_the_entry_point",
                "test_localhost.py::test_localhost_inventory_needs_no_sshd",
                "test_localhost.py::test_check_of_the_localhost_inventory_passes",
                "test_fake_preflight.py::test_check_exits_0_when_every_host_passes"]},
    "1": {ALL: ["test_localhost.py::test_an_internal_error_is_1_with_a_traceback_to_report"]},
    "2": {ALL: ["test_exit_status.py::test_every_command_exits_0_and_2_through_the_entry_point",
                "test_localhost.py::test_a_bad_inventory_is_2_before_anything_is_contacted",
                "test_inventory.py::test_malformed_inventory_is_refused_before_any_ssh",
                "test_preflight_messages.py::"
                "test_a_malformed_known_hosts_is_exit_2_before_any_host_is_contacted",
                "test_cli_usage.py::test_unusable_home_is_one_paragraph_with_the_fix"]},
    "3": {"check": ["test_localhost.py::test_a_failed_check_is_3_and_names_the_real_interfaces",
                    "test_fake_preflight.py::test_check_exits_3_for_a_failed_check",
                    "test_fake_preflight.py::test_check_exits_3_not_4_for_a_silent_probe",
                    "test_host_paths.py::"
                    "test_a_user_without_a_home_directory_is_told_the_path_and_the_fix"],
          "launch": ["test_launch.py::test_preflight_failure_starts_nothing",
                     "test_environments.py::"
                     "test_launch_rebuilds_a_drifted_host_and_refuses_one_that_still_differs"],
          "exec": ["test_localhost.py::test_exec_on_a_host_whose_setup_fails_is_3"],
          "env": ["test_environments_errors.py::"
                  "test_a_host_whose_python_the_uv_project_does_not_allow_is_refused"]},
    "4": {"check": ["test_localhost.py::test_a_refused_ssh_connection_is_4",
                    "test_fake_preflight.py::test_check_exits_4_for_an_unreachable_host",
                    "test_check.py::test_changed_host_key_is_refused_and_nothing_runs",
                    "test_srun_steps.py::test_check_says_the_node_without_a_step_is_unreachable",
                    "test_slurm_runs.py::"
                    "test_a_node_srun_cannot_start_a_step_on_is_unreachable"],
          "launch": ["test_localhost.py::test_a_refused_ssh_connection_is_4"],
          "exec": ["test_exec.py::test_exec_names_an_unreachable_host"],
          "stop": [UNREACHABLE_RUN], "stacks": [UNREACHABLE_RUN], "top --once": [UNREACHABLE_RUN],
          "env": ["test_environments.py::test_a_host_that_cannot_be_reached_is_named_with_exit_4"]},
    "5": {"launch": ["reliability/test_host_faults.py::"
                     "test_a_partitioned_host_is_lost_and_ends_its_own_run",
                     "reliability/test_controller_signals.py::"
                     "test_sigstop_past_the_lease_then_sigcont"]},
    "6": {"launch": ["test_fake_preflight.py::test_launch_exits_6_when_copying_the_code_fails",
                     "reliability/test_disk_full.py::"
                     "test_a_full_disk_stops_the_run_naming_the_host_and_loses_no_line"],
          "env": ["test_environments_hosts.py::"
                  "test_a_full_disk_during_the_build_exits_6_and_leaves_nothing_half_built"]},
    "7": {"launch": ["test_localhost.py::test_a_stall_ended_by_on_stall_stop_is_7",
                     "test_stall.py::test_a_stopped_stall_names_the_hung_rank_and_exits_7"]},
    JOB: {"launch": ["test_localhost.py::"
                     "test_a_failed_job_exits_with_the_root_cause_ranks_own_status",
                     "reliability/test_rank_faults.py::"
                     "test_a_dying_rank_ends_the_run_on_every_host"]},
    "124": {"exec": ["test_localhost.py::test_exec_timeout_is_124_not_unreachable",
                     "test_exec.py::test_exec_timeout_ends_the_command_on_every_host"]},
    "130": {"launch": ["test_localhost.py::"
                       "test_ctrl_c_and_sigterm_stop_the_run_with_their_statuses",
                       "reliability/test_controller_signals.py::"
                       "test_ctrl_c_stops_every_rank_gracefully"],
            "check": [PREFLIGHT_SIGNALS],
            "check --smoke": [CHECK_SMOKE_SIGNALS],
            "exec": ["test_exec.py::test_ctrl_c_of_exec_ends_the_command_on_every_host"]},
    "143": {"launch": ["test_localhost.py::"
                       "test_ctrl_c_and_sigterm_stop_the_run_with_their_statuses",
                       PREFLIGHT_SIGNALS],
            "check": [PREFLIGHT_SIGNALS],
            "check --smoke": [CHECK_SMOKE_SIGNALS]},
}
# What the doc says a command can exit with, through the same code as a row's other commands
# (`check --smoke` runs a launch; `exec` meets the same lost connection and signals), that no
# test shows yet. Each is work to do: once a test shows it, it moves to EXERCISED_BY.
NOT_YET_SHOWN: dict[str, set[str]] = {
    "5": {"check --smoke", "exec"},
    "6": {"check --smoke"},
    JOB: {"check --smoke"},
    "143": {"exec"},
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


def documented_commands() -> dict[str, list[str]]:
    return {row[0]: [c.strip() for c in row[2].split(",")] for row in table("# Exit statuses")}


def test_the_commands_column_is_what_the_tests_show() -> None:
    documented = documented_commands()
    assert set(documented) == set(EXERCISED_BY)
    for status, commands in documented.items():
        shown, claimed = set(EXERCISED_BY[status]), NOT_YET_SHOWN.get(status, set())
        assert not shown & claimed, f"status {status}: {shown & claimed} is shown now"
        assert set(commands) == shown | claimed, f"status {status}: the doc says {commands}"
        assert ALL not in commands or commands == [ALL]


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_exits_0_and_2_through_the_entry_point(
        capsys: pytest.CaptureFixture[str], command: str) -> None:
    """The 'all' of rows 0 and 2: every command's help is 0, and a mistyped option 2."""
    assert run_main(capsys, command, "--help")[0] == ExitStatus.SUCCESS
    code, _out, err = run_main(capsys, command, "--no-such-option")
    assert code == ExitStatus.USAGE, err
    assert err.startswith("clusterrun: error: ") and "Traceback" not in err


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
def module_tests(module: str) -> tuple[dict[str, ast.FunctionDef], bool]:
    """The functions of a test module (tests and helpers), and whether it is marked `cluster` as
    a whole (the reliability suite's conftest marks its modules)."""
    tree = ast.parse((REPO / "tests" / module).read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    marked = any(isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and "cluster" in ast.unparse(node.value) for node in tree.body)
    return functions, marked or module.startswith("reliability/")


def named_test(node_id: str) -> ast.FunctionDef:
    module, _, name = node_id.partition("::")
    found = module_tests(module)[0].get(name)
    assert found is not None, f"no test {node_id}"
    return found


def helpers_called(fn: ast.FunctionDef, module: str) -> list[ast.FunctionDef]:
    """The module's own functions a test calls (one call deep: `launch(hosts, tmp_path)`)."""
    helpers = module_tests(module)[0]
    called = {n.func.id for n in ast.walk(fn)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return [helpers[name] for name in sorted(called & set(helpers))]


def strings(fn: ast.FunctionDef, module: str) -> set[str]:
    """Every string constant in a test, its decorators (parametrize) and the helpers it calls."""
    nodes = [n for f in (fn, *helpers_called(fn, module)) for n in ast.walk(f)]
    nodes += [n for d in fn.decorator_list for n in ast.walk(d)]
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def asserted_statuses(fn: ast.FunctionDef, module: str, depth: int = 1) -> set[int]:
    """The exit statuses a test compares with in its asserts: numbers, and ExitStatus members
    (also where a parametrize decorator hands them to the assert), and those its module's own
    helpers assert for it (one call deep: `error_of(cp)` asserts exit 2)."""
    found: set[int] = set()
    compares = [n for a in ast.walk(fn) if isinstance(a, ast.Assert)
                for n in ast.walk(a.test) if isinstance(n, ast.Compare)]
    given = [n for d in fn.decorator_list for n in ast.walk(d)]
    for node in [n for c in compares for n in ast.walk(c)] + given:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            found.add(node.value)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "ExitStatus" and node.attr in ExitStatus.__members__):
            found.add(int(ExitStatus[node.attr]))
    for helper in helpers_called(fn, module) if depth else ():
        found |= asserted_statuses(helper, module, depth - 1)
    return found


def test_every_named_test_runs_the_command_and_asserts_the_status() -> None:
    for status, by_command in EXERCISED_BY.items():
        for command, node_ids in by_command.items():
            for node_id in node_ids:
                fn, module = named_test(node_id), node_id.partition("::")[0]
                if command != ALL:  # `check --smoke`: both words, as the test runs them
                    missing = set(command.split()) - strings(fn, module)
                    assert not missing, f"status {status}: {node_id} never runs {command}"
                wanted = set(range(1, 256)) if status == JOB else {int(status)}
                assert asserted_statuses(fn, module) & wanted, \
                    f"status {status}: {node_id} asserts no exit status {status}"


@pytest.mark.parametrize("status", sorted(set(EXERCISED_BY) - NEEDS_THE_CLUSTER))
def test_rows_that_need_no_root_have_a_fast_test(status: str) -> None:
    fast = [n for ids in EXERCISED_BY[status].values() for n in ids
            if not module_tests(n.partition("::")[0])[1]]
    assert fast, f"status {status} is only exercised by cluster tests"
