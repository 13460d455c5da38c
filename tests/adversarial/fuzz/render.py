"""A :class:`~.scenario.Scenario` written as a program (run after ``tests.support.PRELUDE``).

Log lines (one ``os.write`` each, through ``record``): ``P <pid>`` the main process
starts; ``R <pid> <name>`` a release function ran; ``K <pid> <name>`` a hook ran;
``C <pid>`` a forked child starts; ``S <status>`` the parent collected the child's exit
status.  Handles are named after their spec (``h0``, ``k0``, ``c0``...), and the raw
object of each handle is its name.
"""

from __future__ import annotations

from .scenario import Scenario

_HEAD = """\
import signal, time
import exitsafe.signals

record(f"P {os.getpid()}")

def rel(raw):
    record(f"R {os.getpid()} {raw}")

def hook(name):
    def run():
        record(f"K {os.getpid()} {name}")
    return run

def pol_release(info):
    return "release"

def pol_leak(info):
    return "leak"

def pol_raise(info):
    raise RuntimeError("fuzz policy refuses")

def holder(name, inside, go):
    h = H[name]
    with h.borrow():
        inside.set()
        go.wait()
    del h

H = {}
"""

_POLICY = {
    None: "",
    "release": ', exit_policy="release"',
    "leak": ', exit_policy="leak"',
    "call-release": ", exit_policy=pol_release",
    "call-leak": ", exit_policy=pol_leak",
    "call-raise": ", exit_policy=pol_raise",
}


def _handles(indices: tuple[int, ...], scenario: Scenario) -> str:
    return "[" + ", ".join(f'H["{scenario.handles[i].name}"]' for i in indices) + "]"


def render(s: Scenario) -> str:
    out = [_HEAD]
    w = out.append
    if s.registry == "own":
        w(f'REG = exitsafe.Registry("fz", exit_policy="{s.default_policy}")\n')
    else:
        w(f'REG = exitsafe.lowlevel.default_registry()\nREG.exit_policy = "{s.default_policy}"\n')
    if s.step_timeout is not None:
        w(f"REG.step_timeout = {s.step_timeout!r}\n")
    if s.exit in ("sigterm-exit", "sigterm-immediate"):
        mode = "exit" if s.exit == "sigterm-exit" else "immediate"
        w(f'exitsafe.signals.teardown_on_signals("SIGTERM", mode="{mode}")\n')
    for h in s.handles:
        deps = f", depends_on={_handles(h.parents, s)}" if h.parents else ""
        w(f'H["{h.name}"] = REG.track("{h.name}", rel, name="{h.name}"{deps}{_POLICY[h.policy]})\n')
        for _ in range(h.extra_owners):
            w(f'H["{h.name}"].retain()\n')
    for k in s.hooks:
        w(
            f'REG.on_teardown(hook("{k.name}"), before={_handles(k.before, s)}, '
            f'after={_handles(k.after, s)}, name="{k.name}")\n'
        )
    for b, spec in enumerate(s.borrows):
        name = s.handles[spec.handle].name
        w(f"inside{b}, go{b} = threading.Event(), threading.Event()\n")
        w(
            f'T{b} = threading.Thread(target=holder, args=("{name}", inside{b}, go{b}), '
            f"daemon={spec.forever})\n"
        )
        w(f"T{b}.start()\ninside{b}.wait()\n")
    for op in s.ops:
        if op[0] == "release":
            w(f'H["{s.handles[op[1]].name}"].release()\n')
        elif op[0] == "drop":
            w(f'del H["{s.handles[op[1]].name}"]\n')
        elif op[0] == "unborrow":
            w(f"go{op[1]}.set()\nT{op[1]}.join()\n")
        elif op[0] == "fork":
            out.extend(_fork(s))
    out.extend(_exit(s))
    return "".join(out)


def _fork(s: Scenario) -> list[str]:
    c = s.child
    assert c is not None
    lines = ["pid = os.fork()\n", "if pid == 0:\n", '    record(f"C {os.getpid()}")\n']
    for name, parents in c.own:
        names = tuple(s.handles[i].name for i in parents)
        lines.append(
            f"    deps = [H[n] for n in {names!r} if n in H and H[n].owners > 0]\n"
            f'    H["{name}"] = REG.track("{name}", rel, name="{name}", depends_on=deps)\n'
        )
    for i in c.releases:
        name = s.handles[i].name
        lines.append(f'    if "{name}" in H:\n        H["{name}"].release()\n')
    if c.release_own:
        for name, _ in c.own:
            lines.append(f'    H["{name}"].release()\n')
    if c.exit == "sys.exit":
        lines.append(f"    sys.exit({c.code})\n")
    else:
        lines.append(f"    exitsafe.exit({c.code})\n")
    lines.append(
        '_, status = os.waitpid(pid, 0)\nrecord(f"S {os.waitstatus_to_exitcode(status)}")\n'
    )
    return lines


def _exit(s: Scenario) -> list[str]:
    if s.exit == "end":
        return []
    if s.exit == "sys.exit":
        return [f"sys.exit({s.code})\n"]
    if s.exit == "exitsafe.exit":
        return [f"exitsafe.exit({s.code})\n"]
    if s.exit == "teardown-late":
        return ["REG.teardown()\n", "for h in list(H.values()):\n    h.release()\n"]
    if s.exit == "raise":
        return ['raise RuntimeError("fuzz: escaping main")\n']
    if s.exit == "keyboard":
        return ["signal.raise_signal(signal.SIGINT)\n", "time.sleep(30)\n"]
    # sigterm-*: the handler runs at the next bytecode boundary of the main thread.
    return [
        "os.kill(os.getpid(), signal.SIGTERM)\n",
        "for _ in range(3000):\n    time.sleep(0.01)\n",
        'record("signal not acted on")\n',
    ]
