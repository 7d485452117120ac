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
from clusterrun.remote.shared import diskfloor
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
          "env": ["test_environments.py::test_a_host_that_cannot_be_reached_is_named_with_exit_4"],
          "pull": ["test_pull_unit.py::test_a_host_down_is_named_and_the_others_are_pulled",
                   "test_pull.py::"
                   "test_pull_a_ddp_run_again_after_one_more_file_and_with_a_host_down"]},
    "5": {"launch": ["reliability/test_host_faults.py::"
                     "test_a_partitioned_host_is_lost_and_ends_its_own_run",
                     "reliability/test_controller_signals.py::"
                     "test_sigstop_past_the_lease_then_sigcont"]},
    "6": {"launch": ["test_fake_preflight.py::test_launch_exits_6_when_copying_the_code_fails",
                     "reliability/test_disk_full.py::"
                     "test_a_full_disk_stops_the_run_naming_the_host_and_loses_no_line"],
          "env": ["test_environments_hosts.py::"
                  "test_a_full_disk_during_the_build_exits_6_and_leaves_nothing_half_built"],
          "pull": ["test_pull_unit.py::test_a_file_that_never_settles_is_an_error_naming_it"]},
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
# test shows yet; the doc marks each "(no test yet)". Each is work to do: once a test shows it,
# it moves to EXERCISED_BY and its mark goes.
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


UNSHOWN_MARK = " (no test yet)"  # after a command in the doc's commands column


def documented_commands() -> dict[str, dict[str, bool]]:
    """Each row's commands, and whether the doc says a test shows it (no UNSHOWN_MARK)."""
    rows = {}
    for row in table("# Exit statuses"):
        cells = [c.strip() for c in row[2].split(",")]
        rows[row[0]] = {c.removesuffix(UNSHOWN_MARK): not c.endswith(UNSHOWN_MARK) for c in cells}
    return rows


def test_the_commands_column_is_what_the_tests_show() -> None:
    """Every command a row names is shown by a test (EXERCISED_BY) or marked "(no test yet)"
    in the doc and listed in NOT_YET_SHOWN; a mark goes when a test shows it."""
    documented = documented_commands()
    assert set(documented) == set(EXERCISED_BY)
    for status, commands in documented.items():
        shown, claimed = set(EXERCISED_BY[status]), NOT_YET_SHOWN.get(status, set())
        assert not shown & claimed, f"status {status}: {shown & claimed} is shown now"
        said_shown = {c for c, ok in commands.items() if ok}
        said_unshown = {c for c, ok in commands.items() if not ok}
        assert said_shown == shown, f"status {status}: the doc says tests show {said_shown}"
        assert said_unshown == claimed, \
            f"status {status}: the doc marks{UNSHOWN_MARK} {said_unshown}, not {claimed}"
        assert ALL not in commands or list(commands) == [ALL]


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
    assert diskfloor.STATUS == HostStatus.DISK_FULL == ExitStatus.SYNC
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


# What an assert reads an exit status from: `cp.returncode`, `code`, `proc.wait()`,
# `state["exit_code"]`, `run_main(...)[0]`. A bare `status` is left out: in these tests it is the
# parametrized value an exit status is compared with, not one read.
STATUS_NAMES = {"code", "rc", "returncode", "exit_code", "exit_status"}


def reads_a_status(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in STATUS_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in STATUS_NAMES | {"status"}
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Attribute) and node.func.attr in ("wait", "poll")
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        key = node.slice.value
        return key in STATUS_NAMES or (key == 0 and isinstance(node.value, ast.Call))
    return False


def compared_with_a_status(compare: ast.Compare) -> list[ast.expr]:
    """The operands of ``compare`` that an exit status read in it is compared with (pairwise
    in tuples: `(root["node"], root["code"]) == ("node2", 3)` gives 3)."""
    operands = [compare.left, *compare.comparators]
    if all(isinstance(o, ast.Tuple) for o in operands) \
            and len({len(o.elts) for o in operands if isinstance(o, ast.Tuple)}) == 1:
        columns = zip(*(o.elts for o in operands if isinstance(o, ast.Tuple)))
        return [v for column in columns
                for v in compared_with_a_status(ast.Compare(column[0], compare.ops,
                                                            list(column[1:])))]
    if not any(reads_a_status(o) for o in operands):
        return []
    return [o for o in operands if not reads_a_status(o)]


@cache
def module_constants(module: str) -> dict[str, ast.expr]:
    """A test module's top-level ``NAME = value`` assignments (none for a module not there)."""
    path = REPO / "tests" / module
    tree = ast.parse(path.read_text()) if path.is_file() else ast.Module([], [])
    return {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def given_values(fn: ast.FunctionDef, module: str) -> list[ast.AST]:
    """Where the names a test compares an exit status with get their values: its parametrize
    decorators, and the module's constants it reads (`_, status, how = FAULTS[fault]`)."""
    read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    constants = module_constants(module)
    return [n for d in fn.decorator_list for n in ast.walk(d)] + [
        n for name in sorted(read & set(constants)) for n in ast.walk(constants[name])]


def status_values(node: ast.expr, given: list[ast.AST]) -> set[int]:
    """The statuses ``node`` stands for: a number, an ExitStatus member, those in a tuple
    (`in (130, 143)`), or a name given elsewhere (``given_values``: their numbers)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return {node.value}
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "ExitStatus" and node.attr in ExitStatus.__members__):
        return {int(ExitStatus[node.attr])}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {v for e in node.elts for v in status_values(e, given)}
    if isinstance(node, ast.Name):
        return {v for n in given if isinstance(n, (ast.Constant, ast.Attribute))
                for v in status_values(n, [])}
    return set()


def asserted_statuses(fn: ast.FunctionDef, module: str, depth: int = 1) -> set[int]:
    """The exit statuses a test asserts an exit status equals (`cp.returncode == 3`, `code ==
    ExitStatus.USAGE`, also where a parametrize decorator hands them to the assert), and those
    its module's own helpers assert for it (one call deep: `error_of(cp)` asserts exit 2). A
    number asserted of anything else (`len(lines) == 4`) is no exit status."""
    found: set[int] = set()
    given = given_values(fn, module)
    compares = [n for a in ast.walk(fn) if isinstance(a, ast.Assert)
                for n in ast.walk(a.test) if isinstance(n, ast.Compare)]
    for compare in compares:
        for operand in compared_with_a_status(compare):
            found |= status_values(operand, given)
    for helper in helpers_called(fn, module) if depth else ():
        found |= asserted_statuses(helper, module, depth - 1)
    return found


@pytest.mark.parametrize(("body", "statuses"), [
    ("cp = run()\nassert len(cp.stdout.splitlines()) == 4", set()),
    ("cp = run()\nassert cp.returncode == 0 and len(cp.stderr) == 4", {0}),
    ("cp = run()\nassert cp.returncode == 4", {4}),
    ("assert proc.wait(timeout=9) in (130, 143)", {130, 143}),
    ("code, out, err = run_main()\nassert code == ExitStatus.UNREACHABLE, err", {4}),
    ("assert (root['node'], root['code'], n) == ('a', 3, 5)", {3}),
    ("assert state['exit_code'] == 6", {6}),
])
def test_only_asserts_on_an_exit_status_count(body: str, statuses: set[int]) -> None:
    fn = ast.parse("def test_x():\n" + "".join(f"    {line}\n" for line in body.splitlines()))
    assert isinstance(fn.body[0], ast.FunctionDef)
    assert asserted_statuses(fn.body[0], "none.py", depth=0) == statuses


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
