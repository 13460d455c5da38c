"""Start-up hook of ``exitsafe run`` /
[`exitsafe.testing.run_command`][exitsafe.testing.run_command].

The runner puts this directory first on ``PYTHONPATH`` and sets ``EXITSAFE_RUN_DIR``, so
every Python process of the run (the program and the Python processes it starts or forks)
imports this module at start-up, before the program.  It:

* writes ``proc-<pid>.txt`` (pid, parent pid, command line) into the run directory, also
  in each forked child, so the runner can name the processes of the run;
* in every process but the first one, sends faulthandler's output to
  ``fault-<pid>.log`` in the run directory, so a child's crash or hang dump is attributed
  to its pid (the first process keeps writing it on stderr);
* loads exitsafe's audit package from its files (``EXITSAFE_AUDIT``; and the list of
  threads alive at exit), which imports only the standard library;
* imports exitsafe when ``EXITSAFE_QUIESCE`` asks for the threads to be quiesced at exit
  (a program that never imports exitsafe gets it too);
* then imports the ``sitecustomize`` this one shadows, if there is one, and removes its
  own directory from ``sys.path``.

Anything that fails here is ignored: the hook must never change whether the program runs.
"""

import os
import sys


def _boot() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    while here in sys.path:
        sys.path.remove(here)
    run_dir = os.environ.get("EXITSAFE_RUN_DIR")
    if run_dir and os.path.isdir(run_dir):
        try:
            _record(run_dir)
        except Exception:
            pass
    try:
        _load_audit(here)
    except Exception:
        pass
    asked = os.environ.get("EXITSAFE_QUIESCE", "").strip().lower()
    if asked not in ("", "0", "false", "no", "off"):
        try:
            import exitsafe  # noqa: F401  (its import reads EXITSAFE_QUIESCE)
        except Exception:
            pass
    _chain(here)


def _proc_cmdline() -> list:  # type: ignore[type-arg]
    """The command line as the kernel has it (before 3.10 there is no ``sys.orig_argv``)."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _record(run_dir: str) -> None:
    pid = os.getpid()
    root = os.environ.get("EXITSAFE_RUN_ROOT")
    if root is None:
        os.environ["EXITSAFE_RUN_ROOT"] = root = str(pid)

    def write(how: str) -> None:
        # pid, parent pid, how it started, then the command line, one field a line
        # (json would cost every process of the run an import)
        argv = list(getattr(sys, "orig_argv", None) or _proc_cmdline() or [
            sys.executable, *sys.argv
        ])
        fields = [str(os.getpid()), str(os.getppid()), how]
        fields += [a.replace("\n", " ") for a in argv]
        path = os.path.join(run_dir, f"proc-{os.getpid()}.txt")
        # (written aside, then renamed: a process killed while it writes, a pool's worker
        # terminated as it starts, leaves no half record for the reader)
        with open(path + ".part", "w", encoding="utf-8", errors="replace") as fh:
            fh.write("\n".join(fields) + "\n")
        os.replace(path + ".part", path)

    write("exec")
    # File descriptors, not file objects: a file object left open in this closure is
    # finalized by PyInterpreterState_Clear, and on CPython 3.9 its ResourceWarning
    # there dereferences the already-cleared sys dict (SIGSEGV in every forked child).
    kept: list = []  # type: ignore[type-arg]

    def to_file() -> None:
        import faulthandler

        if not faulthandler.is_enabled():
            return
        fd = os.open(
            os.path.join(run_dir, f"fault-{os.getpid()}.log"),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
            0o644,
        )
        faulthandler.enable(file=fd, all_threads=True)
        for old in kept:  # the parent's log, inherited by this child: no longer used
            os.close(old)
        kept[:] = [fd]

    def after_fork() -> None:
        try:
            write("fork")
            to_file()
        except Exception:
            pass

    if str(pid) != root:
        to_file()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=after_fork)


def _load(name: str, path: str, package: bool = False) -> object:
    """Load the module at ``path`` as ``name`` (with its bytecode cache), cheaply; with
    ``package``, ``path`` is a package's ``__init__.py``, whose modules then import as
    ``name.<module>``."""
    import importlib.machinery
    import types

    loader = importlib.machinery.SourceFileLoader(name, path)
    module = types.ModuleType(name)
    module.__file__ = path
    module.__loader__ = loader
    module.__spec__ = importlib.machinery.ModuleSpec(
        name, loader, origin=path, is_package=package
    )
    if package:
        module.__path__ = [os.path.dirname(path)]
        module.__package__ = name
        module.__spec__.submodule_search_locations = module.__path__
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def _load_audit(here: str) -> None:
    if not (os.environ.get("EXITSAFE_AUDIT") or os.environ.get("EXITSAFE_TRACE")):
        return
    path = os.path.join(os.path.dirname(os.path.dirname(here)), "_audit", "__init__.py")
    module = _load("exitsafe_boot_audit", path, package=True)
    module.boot()  # type: ignore[attr-defined]


def _chain(here: str) -> None:
    """Import the ``sitecustomize`` module this one hides, if any."""
    import importlib.machinery

    try:
        path = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return
        _load("sitecustomize", spec.origin)
    except Exception:
        import traceback

        traceback.print_exc()  # as site.py would report an error in sitecustomize


_boot()
