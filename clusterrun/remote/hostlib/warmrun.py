"""Starting one of clusterrun's programs as a fork of the session's agent (stdlib only, 3.6+).

A program reaches a host as ``python -u -c BOOTSTRAP`` with the program on its stdin; most of
what that costs on a warm connection is the new interpreter's start and its imports. When the
agent itself is that interpreter (the same ``python:`` found on the same PATH, no ``setup:``,
no container), it forks instead: the child becomes what the command line would have started,
a session of its own from the home directory whose stdin, stdout and stderr are the request's
pipes, and runs BOOTSTRAP's body there, with the standard library modules the programs import
already loaded (WARM). It ends as that interpreter would end (threads joined, atexit, the same
exit status for a return, SystemExit, an uncaught exception or Ctrl-C), and a chained program
after it still starts a fresh interpreter, as BOOTSTRAP does.
"""

import atexit
import builtins
import collections
import contextlib
import hashlib
import io
import os
import signal
import sys
import types

# The standard library modules that the programs a command runs through the session import
# (exec's command.py, check's probe.py, launch's run.py, stacks, status, stop, logs, outputs,
# with their shared modules; tests hold the list to them): loaded once in the agent (tens of
# milliseconds of every new interpreter's start), found loaded by every child.
WARM = ("contextlib", "ctypes", "enum", "errno", "fcntl", "gc", "glob", "hashlib", "hmac",
        "importlib", "json", "pickle", "pwd", "queue", "random", "re", "resource", "selectors",
        "signal", "socket", "struct", "subprocess", "tempfile", "threading", "time", "traceback",
        "typing")

_found = {}  # a python: as the inventory names it -> whether it is this interpreter
KEEP = 16  # programs an agent keeps compiled, the oldest forgotten first
_LONGEST_HEADER = 80  # BOOTSTRAP's length line ("87630 c S\n") is far shorter


def preload():
    for name in WARM:
        with contextlib.suppress(ImportError):
            __import__(name)


def is_this_interpreter(python):
    """Whether ``/bin/sh -c 'exec PYTHON ...'`` from the home directory would start this very
    interpreter: found as the shell finds it (a path as it is, else the first executable on
    PATH), compared as a path, never through symbolic links (a venv's python links to the
    system's and is not it)."""
    if python not in _found:
        _found[python] = _lookup(python) == os.path.normpath(sys.executable or "")
    return _found[python]


def _lookup(python):
    home = os.path.expanduser("~")
    if os.sep in python:
        return os.path.normpath(os.path.join(home, python))
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(home, folder or ".", python)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.normpath(path)
    return None


class Forked:
    """The child, as subprocess.Popen shows one: its pipes and ``poll``."""

    def __init__(self, pid, stdin, stdout, stderr):
        self.pid = pid
        self.stdin = os.fdopen(stdin, "wb", buffering=0)
        self.stdout = os.fdopen(stdout, "rb", buffering=0)
        self.stderr = os.fdopen(stderr, "rb", buffering=0)
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 255 << 8
            if pid == self.pid:
                self.returncode = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                                   else os.WEXITSTATUS(status))
        return self.returncode


def split_program(data):
    """BOOTSTRAP's input as it has come so far: (its length line, the program, what follows),
    None while the program is not all here, False when the input is not that (BOOTSTRAP
    then reads it, and fails on it, as ever)."""
    end = data.find(b"\n", 0, _LONGEST_HEADER)
    if end < 0:
        return None if len(data) < _LONGEST_HEADER else False
    try:
        size = int(bytes(data[:end]).split()[0])
    except (IndexError, ValueError):
        return False
    if size < 0:  # read to the end of stdin
        return False
    if len(data) < end + 1 + size:
        return None
    return bytes(data[:end + 1]), bytes(data[end + 1:end + 1 + size]), bytes(data[end + 1 + size:])


class Programs:
    """The programs this agent was sent, by digest, each compiled (and a bundle's pieces
    unpacked) once: a fork runs the kept code instead of compiling and unpacking ~100 KB
    again for every command."""

    def __init__(self, loader=None, keep=KEEP):
        self.loader = loader  # how a bundle begins: its loader's definitions (bundle.py)
        self.keep = keep
        self.kept = collections.OrderedDict()

    def get(self, program):
        """(code, the globals to run it in), or None for a program that does not compile
        (BOOTSTRAP compiles it in the fork, and says why, as ever)."""
        digest = hashlib.sha256(program).digest()
        found = self.kept.get(digest)
        if found is None:
            found = self.kept[digest] = _prepared(program, self.loader) or False
            while len(self.kept) > self.keep:
                self.kept.popitem(last=False)
        else:
            self.kept.move_to_end(digest)
        return found or None


def _prepared(program, loader):
    try:
        code = compile(program, "<clusterrun>", "exec", dont_inherit=True)
    except Exception:
        return None
    run_in = {"__name__": "__main__"}
    if loader and program.startswith(loader):
        kept = _unpacked(program, code, loader)
        if kept:
            run_in["_clusterrun_kept"] = kept
    return code, run_in


def _unpacked(program, code, loader):
    """A bundle's pieces unpacked by its own loader, keyed by the very string constants of
    ``code`` that hold them (each fork then finds them by identity, their hash kept)."""
    import ast  # only here: once per program an agent is sent

    names = {}
    try:
        exec(compile(loader, "<clusterrun>", "exec", dont_inherit=True), names)  # noqa: S102
        unpack = names["_clusterrun_code"]
        tree = ast.parse(program)
    except Exception:
        return {}
    by_source = {}
    for node in tree.body:
        for call in ast.walk(node) if isinstance(node, ast.Expr) else ():
            piece = _piece(ast, call)
            if piece is not None:
                with contextlib.suppress(Exception):
                    by_source[piece[0]] = unpack(*piece)
    return {c: by_source[c] for c in code.co_consts if isinstance(c, str) and c in by_source}


def _piece(ast, call):
    """(source, magic, code, filename) of a loader's call in a bundle, or None."""
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        return None
    try:
        args = [ast.literal_eval(arg) for arg in call.args]
    except ValueError:
        return None
    if call.func.id == "_clusterrun_module" and len(args) == 4 and isinstance(args[1], str):
        return args[1], args[2], args[3], "<clusterrun %s>" % args[0]
    if call.func.id == "_clusterrun_code" and len(args) == 4 and isinstance(args[0], str):
        return tuple(args)
    return None


def spawn(boot, site, cwd, kept=None):
    """Fork a child that runs BOOTSTRAP's body ``boot`` (``site``: as without -S); a Forked.
    ``kept``: (the length line, code, globals) of a program this agent keeps, which the child
    then neither reads nor compiles."""
    stdin, stdout, stderr = os.pipe(), os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _child(boot, site, cwd, (stdin[0], stdout[1], stderr[1]), kept)
        except BaseException as exc:  # before the program ran (it ends in _finalize)
            with contextlib.suppress(OSError):
                os.write(2, ("clusterrun: the agent could not start the program: %s\n"
                             % (exc,)).encode())
        os._exit(255)
    for fd in (stdin[0], stdout[1], stderr[1]):
        os.close(fd)
    return Forked(pid, stdin[1], stdout[0], stderr[0])


def _child(boot, site, cwd, pipes, kept):
    os.setsid()
    for to, fd in enumerate(pipes):
        os.dup2(fd, to)
    _close_from(3)  # the agent's channel and every other request's pipes
    os.chdir(cwd)
    _fresh_stdio()
    sys.argv = ["-c"]
    for name in [name for name in sys.modules if name.split(".")[0] == "clusterrun"]:
        del sys.modules[name]  # the program brings its own, as into a new interpreter
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    if kept is not None:
        main.__dict__["W"] = kept  # BOOTSTRAP takes it (shell.BOOT_BODY)
    sys.modules["__main__"] = main
    if site:
        import site as site_module  # what an interpreter started without -S does first

        # It does so before -c puts the current folder ("") first, which site would make
        # absolute.
        lead = [path for path in sys.path[:1] if path == ""]
        del sys.path[:len(lead)]
        site_module.main()
        sys.path[:0] = lead
    code = compile("B=%r;exec(B)" % boot, "<string>", "exec")
    status, interrupted = 0, False
    try:
        exec(code, main.__dict__)  # noqa: S102 - BOOTSTRAP, as ``python -c`` runs it
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:  # as the interpreter prints and exits for an uncaught one
        interrupted = isinstance(exc, KeyboardInterrupt)
        tb = exc.__traceback__
        exc = exc.with_traceback(tb.tb_next if tb is not None else None)  # not this frame
        sys.excepthook(type(exc), exc, exc.__traceback__)
        status = 1
    _finalize(status, interrupted)


def _close_from(low):
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(low, os.sysconf("SC_OPEN_MAX")))
    for fd in fds:
        if fd >= low:
            with contextlib.suppress(OSError):
                os.close(fd)


def _fresh_stdio():
    """sys.stdin, stdout and stderr made anew on fds 0, 1 and 2, as ``python -u`` makes them:
    the agent's own still hold what they read ahead from its channel."""
    made = [_stream(fd, old) for fd, old in ((0, sys.stdin), (1, sys.stdout), (2, sys.stderr))]
    sys.stdin, sys.stdout, sys.stderr = made
    for name, stream in zip(("__stdin__", "__stdout__", "__stderr__"), made):
        sys.__dict__[name] = stream  # what the interpreter started with, as it would have


def _stream(fd, old):
    # Lines split at "\n" only, as on POSIX; -u: stdout and stderr unbuffered, stdin not.
    if fd == 0:
        return io.TextIOWrapper(open(0, "rb", closefd=False), encoding=old.encoding,
                                errors=old.errors, newline="\n")
    return io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False), encoding=old.encoding,
                            errors=old.errors, newline="\n", write_through=True)


def _exit_status(code):
    """The exit status an interpreter gives for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(1 << 63) <= code < (1 << 63) else 255
    with contextlib.suppress(Exception):
        sys.stderr.write("%s\n" % (code,))
    return 1


def _finalize(status, interrupted):
    """What the interpreter does on its way out: non-daemon threads joined, atexit's functions,
    the streams flushed; Ctrl-C ends it by SIGINT (3.8+)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(Exception):
            threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted and sys.version_info >= (3, 8):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)
