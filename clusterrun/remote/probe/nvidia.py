"""What nvidia-smi says about this host's GPUs, for the preflight probe (stdlib only, 3.6+).

Shipped with probe.py (see clusterrun/transport/shell.py). Each query runs on its own: one field
an old driver does not know makes nvidia-smi refuse the whole query, and the other answers are
still worth having. The queries run in parallel, each under a timeout: without persistence mode
every nvidia-smi call initialises the driver, which takes seconds on a large machine, and the
probe has to answer within the controller's deadline.
"""

import os
import pwd
import subprocess
import threading

TYPE_CHECKING = False  # mypy takes it as true; hosts skip importing typing (~4 ms)
if TYPE_CHECKING:
    from typing import Any  # noqa: F401 - used in type comments (Python 3.6: no annotations)

QUERY_SECONDS = 8
NO_ANSWER = "nvidia-smi gave no answer within %d s"

# Each query's fields, in the order its CSV columns come back.
GPU_FIELDS = ("index", "uuid", "name", "driver_version", "memory.used", "memory.total",
              "compute_mode")
ECC_FIELDS = ("index", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
REMAP_FIELDS = ("gpu_uuid", "remapped_rows.pending", "remapped_rows.failure")
APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")

QUERIES = {
    "gpus": ["--query-gpu=" + ",".join(GPU_FIELDS)],
    "ecc": ["--query-gpu=" + ",".join(ECC_FIELDS)],
    "remapped_rows": ["--query-remapped-rows=" + ",".join(REMAP_FIELDS)],
    "apps": ["--query-compute-apps=" + ",".join(APP_FIELDS)],
}
FORMAT = "--format=csv,noheader,nounits"


def no_answer(why):
    """Whether ``nvidia_smi`` failed for want of an answer in time (not the driver's error)."""
    return bool(why) and why.startswith(NO_ANSWER.partition("%")[0])


def nvidia_smi(argv, timeout=QUERY_SECONDS):
    """(stdout, None) or (None, why it failed)."""
    try:
        proc = subprocess.run(["nvidia-smi", *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, NO_ANSWER % timeout
    except OSError as exc:
        return None, exc.strerror or str(exc)
    out = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0:
        said = (proc.stderr.decode("utf-8", "replace") + out).strip().splitlines()
        return None, "nvidia-smi exited %d: %s" % (proc.returncode,
                                                 said[0] if said else "no message")
    return out, None


def value(text):
    """A CSV cell, or None for the ways nvidia-smi says it does not know: [N/A],
    [Not Supported], [Unknown Error], [Insufficient Permissions], N/A."""
    text = text.strip()
    if not text or text.startswith("[") or text.upper() == "N/A":
        return None
    return text


def number(text):
    text = value(text)
    if text is None:
        return None
    try:
        return int(float(text.split()[0]))
    except ValueError:
        return None


def flag(text):
    """Yes/No as drivers print it (some print 0/1): None when unknown."""
    text = value(text)
    if text is None:
        return None
    if text.lower() in ("yes", "true", "enabled"):
        return True
    if text.lower() in ("no", "false", "disabled"):
        return False
    count = number(text)
    return None if count is None else count > 0


def rows(text, fields):
    """CSV rows as lists of cells. A cell may hold ", " (GPU and process names) only in the
    one free-text column, so every other column is taken from its own end of the line."""
    loose = [i for i, f in enumerate(fields) if f in ("name", "process_name")]
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > len(fields) and loose:
            at = loose[0]
            tail = len(fields) - at - 1
            end = len(cells) - tail
            cells = [*cells[:at], ", ".join(cells[at:end]), *cells[end:]]
        if len(cells) == len(fields):
            out.append(cells)
    return out


def parse_gpus(text):
    gpus = []
    for index, uuid, name, driver, used, total, mode in rows(text, GPU_FIELDS):
        gpus.append({"index": number(index), "uuid": value(uuid), "name": value(name),
                     "driver": value(driver), "memory_used": number(used),
                     "memory_total": number(total), "compute_mode": value(mode),
                     "ecc_uncorrected": None, "retired_pages_pending": None,
                     "remap_pending": None, "remap_failure": None})
    return [g for g in gpus if g["index"] is not None]


def parse_ecc(text, gpus):
    by_index = {g["index"]: g for g in gpus}
    for index, ecc, retired in rows(text, ECC_FIELDS):
        gpu = by_index.get(number(index))
        if gpu is not None:
            gpu["ecc_uncorrected"] = number(ecc)
            gpu["retired_pages_pending"] = flag(retired)


def parse_remaps(text, gpus):
    by_uuid = {g["uuid"]: g for g in gpus}
    for uuid, pending, failure in rows(text, REMAP_FIELDS):
        gpu = by_uuid.get(value(uuid))
        if gpu is not None:
            gpu["remap_pending"] = flag(pending)
            gpu["remap_failure"] = flag(failure)


def parse_apps(text, gpus):
    by_uuid = {g["uuid"]: g["index"] for g in gpus}
    apps = []
    for uuid, pid, used, name in rows(text, APP_FIELDS):
        pid_number = number(pid)
        app = {"gpu": by_uuid.get(value(uuid)), "gpu_uuid": value(uuid), "pid": pid_number,
               "used_memory": number(used), "process_name": value(name)}
        app.update(owner(pid_number))
        apps.append(app)
    return apps


def owner(pid):
    """Who runs ``pid`` here. A pid this host's /proc does not show belongs to another PID
    namespace (a container, or this probe runs in one): its owner is unknown, not absent."""
    found = {"uid": None, "user": None, "visible": False, "mine": None}  # type: dict[str, Any]
    if pid is None:
        return found
    try:
        with open("/proc/%d/status" % pid) as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    found["uid"] = int(line.split()[2])  # effective uid, as ps shows it
                    break
    except (OSError, ValueError, IndexError):
        return found
    found["visible"] = True
    if found["uid"] is not None:
        found["mine"] = found["uid"] == os.geteuid()
        try:
            found["user"] = pwd.getpwuid(found["uid"]).pw_name
        except KeyError:
            found["user"] = str(found["uid"])
    return found


def _answers():
    """Every query's (stdout, error), asked in parallel."""
    answers = {}
    threads = []
    for key, argv in QUERIES.items():
        def ask(key=key, argv=argv):
            answers[key] = nvidia_smi([*argv, FORMAT])
        thread = threading.Thread(target=ask, daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(QUERY_SECONDS + 2)
    return answers


def _on_path():
    for folder in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        path = os.path.join(folder or ".", "nvidia-smi")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def facts():
    """This host's GPUs as a JSON-able dict; see clusterrun/preflight/gpus.py for its shape."""
    found = {"smi": _on_path(), "count": 0, "driver": None, "gpus": [], "apps": [],
             "errors": {}}  # type: dict[str, Any]
    if found["smi"] is None:
        return found
    answers = _answers()
    late = (None, NO_ANSWER % QUERY_SECONDS)
    for key in QUERIES:
        answers.setdefault(key, late)
        if answers[key][1] is not None:
            found["errors"][key] = answers[key][1]
    text = answers["gpus"][0]
    if text is None:
        # The driver cannot be asked (not loaded, or a driver/library mismatch after an
        # upgrade): `-L` may still count the GPUs, which is what the run's size depends on.
        listing, _error = nvidia_smi(["-L"])
        found["count"] = sum(1 for line in (listing or "").splitlines()
                             if line.startswith("GPU "))
        return found
    found["gpus"] = parse_gpus(text)
    found["count"] = len(found["gpus"])
    drivers = [g["driver"] for g in found["gpus"] if g["driver"]]
    found["driver"] = drivers[0] if drivers else None
    for key, parse in (("ecc", parse_ecc), ("remapped_rows", parse_remaps)):
        if answers[key][0] is not None:
            parse(answers[key][0], found["gpus"])
    if answers["apps"][0] is not None:
        found["apps"] = parse_apps(answers["apps"][0], found["gpus"])
    return found
