"""Convert Sphinx roles in docstrings to mkdocs-autorefs links or code spans.

:role:`target` -> [`shown`][public.path] when public.path is an object of the built API
reference (objects.inv), else `shown`.  Only string-literal statements are touched.
Usage: convert_roles.py objects.inv file.py...
"""
import ast
import re
import sys
import zlib
from pathlib import Path

ROLE = re.compile(r":(func|meth|class|attr|mod|data|exc|obj):`(~?)([^`]+)`")


def inventory(path):
    data = Path(path).read_bytes().split(b"\n", 4)[4]
    names = set()
    for line in zlib.decompress(data).decode().splitlines():
        parts = line.split()
        if len(parts) > 1 and parts[1].startswith("py:"):
            names.add(parts[0])
    return {n for n in names if not any(p.startswith("_") for p in n.split("."))}


def public_module(path):
    parts = list(Path(path).with_suffix("").parts)
    parts = parts[parts.index("exitsafe"):]
    if parts[-1] == "__init__":
        parts.pop()
    while len(parts) > 1 and parts[-1].startswith("_"):
        parts.pop()
    return ".".join(parts)


def contexts(tree):
    """(first_line, last_line, class_name or None) of every string statement."""
    out = []

    def visit(node, cls):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant) and isinstance(
                child.value.value, str
            ):
                out.append((child.lineno, child.end_lineno, cls))
            visit(child, child.name if isinstance(child, ast.ClassDef) else cls)

    visit(tree, None)
    return out


def convert(path, names):
    text = Path(path).read_text()
    lines = text.splitlines(keepends=True)
    mod = public_module(path)
    unresolved = []
    for first, last, cls in contexts(ast.parse(text)):
        chunk = "".join(lines[first - 1:last])

        def repl(m, cls=cls, first=first):
            role, tilde, target = m.groups()
            target = target.lstrip(".").strip()
            shown = target.rsplit(".", 1)[-1] if tilde else target
            if role in ("func", "meth") and not shown.endswith(")"):
                shown_code = shown
            else:
                shown_code = shown
            cands = []
            if target.startswith("exitsafe."):
                cands.append(target)
            if cls:
                cands.append(f"{mod}.{cls}.{target}")
            cands += [f"{mod}.{target}", f"exitsafe.{target}", f"exitsafe.testing.{target}"]
            for c in cands:
                if c in names:
                    return f"[`{shown_code}`][{c}]"
            unresolved.append(f"{path}:{first}: {m.group(0)}")
            return f"`{shown_code}`"

        new = ROLE.sub(repl, chunk)
        if new != chunk:
            new_lines = new.splitlines(keepends=True)
            lines[first - 1:last] = new_lines + [""] * (last - first + 1 - len(new_lines))
    Path(path).write_text("".join(lines))
    return unresolved


if __name__ == "__main__":
    names = inventory(sys.argv[1])
    for f in sys.argv[2:]:
        for u in convert(f, names):
            print("code span:", u)
