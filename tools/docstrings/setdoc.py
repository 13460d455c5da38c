"""setdoc(path, {qualname: text}): replace docstrings (qualname "" = the module's).

The text is dedented and re-indented to the docstring's place; lines over 100 columns are refused.
"""
import ast
import textwrap
from pathlib import Path


def _find(tree):
    out = {}

    def visit(node, prefix):
        for child in getattr(node, "body", []):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = f"{prefix}{child.name}"
                body = child.body
                first = body[0] if body else None
                if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                        and isinstance(first.value.value, str)):
                    out[q] = (body[0].lineno, body[0].end_lineno, body[0].col_offset)
                else:
                    out[q] = (body[0].lineno, None, body[0].col_offset)
                if isinstance(child, ast.ClassDef):
                    visit(child, q + ".")
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        out[""] = (body[0].lineno, body[0].end_lineno, 0)
    visit(tree, "")
    return out


def setdoc(path, docs):
    p = Path(path)
    lines = p.read_text().split("\n")
    where = _find(ast.parse(p.read_text()))
    edits = []
    for q, text in docs.items():
        first, last, col = where[q]
        ind = " " * col
        text = textwrap.dedent(text).strip("\n")
        body = [(ind + line) if line.strip() else "" for line in text.split("\n")]
        body[0] = ind + '"""' + body[0][len(ind):]
        if len(body) == 1 and len(body[0]) + 3 <= 100:
            body[0] += '"""'
        else:
            body.append(ind + '"""')
        for b in body:
            assert len(b) <= 100, (q, b)
        if last is None:  # no docstring: insert
            edits.append((first, first - 1, body))
        else:
            edits.append((first, last, body))
    for first, last, body in sorted(edits, reverse=True):
        lines[first - 1:last] = body
    p.write_text("\n".join(lines))
