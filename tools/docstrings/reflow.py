"""Rewrap docstring lines longer than 100 columns (from the long line to its paragraph's end)."""
import re
import sys
from pathlib import Path

W = 100
BULLET = re.compile(r"^(\s*)([*-] |\d+\. )")


def indent_of(s):
    return len(s) - len(s.lstrip(" "))


def fix(path):
    lines = Path(path).read_text().split("\n")
    i = 0
    changed = 0
    while i < len(lines):
        line = lines[i]
        if len(line) <= W or line.lstrip().startswith("#") or "http" in line:
            i += 1
            continue
        m = BULLET.match(line)
        cont = len(m.group(0)) if m else indent_of(line)
        if line.lstrip().startswith('"""'):
            cont = indent_of(line)
        # paragraph continuation lines
        j = i + 1
        opening_only = line.lstrip().startswith('"""') and line.count('"""') == 1
        closes = '"""' in line and not opening_only
        while j < len(lines) and not closes:
            nxt = lines[j]
            if (not nxt.strip() or indent_of(nxt) != cont or BULLET.match(nxt)
                    or nxt.strip().startswith(('"""', "```", ">>>", ":"))
                    or '"""' in lines[j - 1]):
                break
            j += 1
        line.split()
        first_prefix = line[: indent_of(line)]
        text_words = []
        for k in range(i, j):
            text_words += lines[k].split()
        out = []
        cur = first_prefix
        for w in text_words:
            candidate = (cur + " " + w) if cur.strip() else cur + w
            if len(candidate) > W and cur.strip():
                out.append(cur)
                cur = " " * cont + w
            else:
                cur = candidate
        out.append(cur)
        lines[i:j] = out
        changed += 1
        i += len(out)
    Path(path).write_text("\n".join(lines))
    return changed


for p in sys.argv[1:]:
    n = fix(p)
    if n:
        print(p, n)
