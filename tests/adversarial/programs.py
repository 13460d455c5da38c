"""Code shared by the adversarial programs (prepended to a program's body)."""

from __future__ import annotations

import textwrap

#: ``force_in_sections(action)``: from now on, on every thread, ``action()`` runs once
#: inside every critical section the program reaches (at the first line exitsafe
#: executes after taking its lock).  ``in_section()`` tells a finalizer whether it
#: interrupted one (the proof that the hazard really happened).
FORCE_IN_SECTIONS = textwrap.dedent(
    """
    import exitsafe._sync as _probe

    _ES_DIR = os.path.dirname(exitsafe.__file__)

    def in_section():
        return _probe.reentered()

    def force_in_sections(action):
        inside = set()  # threads whose current section already had its action

        def tracer(frame, event, arg):
            if event == "call":
                return tracer if frame.f_code.co_filename.startswith(_ES_DIR) else None
            if event == "line":
                me = threading.get_ident()
                if not _probe.reentered():
                    inside.discard(me)
                elif me not in inside:
                    inside.add(me)
                    action()
            return tracer

        sys.settrace(tracer)
        threading.settrace(tracer)

    def stop_forcing():
        sys.settrace(None)
        threading.settrace(None)
    """
)

#: Outcomes the ledger JSON holds, per registry: ``outcomes_of(path)``.
LEDGER_TOOLS = textwrap.dedent(
    """
    import json

    def outcomes_of(path):
        with open(path) as fh:
            data = json.load(fh)
        return {r["name"]: [e["outcome"] for e in r["entries"]] for r in data["registries"]}
    """
)


def program(*parts: str, **constants: object) -> str:
    """One program from ``parts`` (each dedented on its own), after ``NAME = value`` lines."""
    head = "".join(f"{name} = {value!r}\n" for name, value in constants.items())
    return head + "".join(textwrap.dedent(part) for part in parts)
