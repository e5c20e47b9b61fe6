#!/usr/bin/env python3
"""Structure rules of issue 12 over the tracked C/CUDA sources (git ls-files;
.c .h .cu .cuh). `make check-structure` runs it. Prints each violation as
`path:line: what`, then a summary line; exits 1 when there is any.

  (a) a source file over MAX_FILE_LINES lines (tests/fixtures excluded);
  (b) a function over MAX_FUNC_LINES lines: a definition starts at column 0
      and ends at the next `}` at column 0; its length is the difference of
      the two line numbers;
  (c) DL_CUDA in a preprocessor conditional in a stage (STAGES): the stages
      reach CUDA through common/, never through #ifdef;
  (d) the include graph between top-level areas (common/<area>, proto, tools,
      supervisor, the stages, tests, bench): no cycle among common/* and
      proto, and nothing under common/ or proto/ includes tools/ or
      supervisor/.

Python 3 standard library only.
"""
import os
import re
import subprocess
import sys

MAX_FILE_LINES = 1000
MAX_FUNC_LINES = 150
EXTS = (".c", ".h", ".cu", ".cuh")
STAGES = ("loader", "target_worker", "drafter_worker", "optimizer")
TOP_AREAS = ("proto", "tools", "supervisor", "tests", "bench") + STAGES
FORBIDDEN_FROM_CORE = ("tools", "supervisor")

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
COND_RE = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|elifdef|elifndef)\b(.*)")
DEF_START_RE = re.compile(r"^[A-Za-z_][^;=]*\(")   # col 0, a '(' before any ';' or '='
ATTRIBUTES = {"__launch_bounds__", "__attribute__", "__declspec", "alignas", "_Alignas"}
NOT_DEF_RE = re.compile(r"^(typedef|extern\s+\"C\"|struct\s+\w+\s*;|_Static_assert|static_assert)\b")


def strip_comments(text):
    """text with comments and string/char literal bodies blanked, newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * max(0, j - i - 2) + (c if j - i >= 2 else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def area_of(path):
    """The node of path in the include graph, or None outside the areas."""
    parts = path.split("/")
    if parts[0] == "common" and len(parts) > 2:
        return "common/" + parts[1]
    if parts[0] in TOP_AREAS and len(parts) > 1:
        return parts[0]
    return None


def is_core(area):
    return area == "proto" or area.startswith("common/")


def functions(lines):
    """(start_line, end_line, name) of the definitions in comment-stripped lines
    (1-based line numbers)."""
    out, i, n = [], 0, len(lines)
    while i < n:
        line = lines[i]
        if not DEF_START_RE.match(line) or NOT_DEF_RE.match(line):
            i += 1
            continue
        # the signature runs until a '{' (definition) or a ';' (declaration);
        # a blank or preprocessor line first means it was neither
        j, body = i, False
        while j < n and j < i + 20:
            s = lines[j]
            if j > i and (not s.strip() or s.lstrip().startswith("#")):
                break
            if "{" in s:
                body = "=" not in s.split("{", 1)[0]
                break
            if ";" in s:
                break
            j += 1
        if not body:
            i += 1
            continue
        k = j if lines[j].startswith("}") and j > i else j + 1
        while k < n and not lines[k].startswith("}"):
            k += 1
        if k >= n:
            break
        sig = " ".join(lines[i:j + 1])
        names = [nm for nm in re.findall(r"([A-Za-z_]\w*)\s*\(", sig) if nm not in ATTRIBUTES]
        out.append((i + 1, k + 1, names[0] if names else "?"))
        i = k + 1
    return out


def find_cycle(graph, nodes):
    """One cycle (list of nodes, first == last) inside the strongly connected
    set nodes, or None."""
    start = sorted(nodes)[0]
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph.get(node, ())):
            if nxt not in nodes:
                continue
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def sccs(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, on, st, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        st.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = st.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = subprocess.run(["git", "-C", root, "ls-files"], check=True, capture_output=True,
                           text=True).stdout.split("\n")
    files = sorted(f for f in files if f.endswith(EXTS) and os.path.isfile(os.path.join(root, f)))
    viol = {"a": [], "b": [], "c": [], "d": []}
    edges = {}      # (from_area, to_area) -> first "path:line"
    n_funcs = 0
    for path in files:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        raw = text.split("\n")
        n_lines = len(raw) - (1 if text.endswith("\n") else 0)
        if n_lines > MAX_FILE_LINES and not path.startswith("tests/fixtures/"):
            viol["a"].append(f"{path}:{n_lines}: file of {n_lines} lines, over {MAX_FILE_LINES}")
        code = strip_comments(text).split("\n")
        for start, end, name in functions(code):
            n_funcs += 1
            if end - start > MAX_FUNC_LINES:
                viol["b"].append(f"{path}:{start}: function {name} of {end - start} lines, over {MAX_FUNC_LINES}")
        src_area = area_of(path)
        for ln, (line, cline) in enumerate(zip(raw, code), 1):
            cm = COND_RE.match(cline)
            if cm and path.split("/")[0] in STAGES and re.search(r"\bDL_CUDA\b", cm.group(2)):
                viol["c"].append(f"{path}:{ln}: DL_CUDA in a preprocessor conditional in a stage "
                                 f"(#{cm.group(1)}): reach CUDA through common/")
            im = INCLUDE_RE.match(line)
            if not im or not src_area:
                continue
            inc = im.group(1)
            if "/" not in inc:   # relative to the including file
                inc = os.path.normpath(os.path.join(os.path.dirname(path), inc))
            dst_area = area_of(inc)
            if not dst_area or dst_area == src_area:
                continue
            edges.setdefault((src_area, dst_area), f"{path}:{ln}")
            if is_core(src_area) and dst_area in FORBIDDEN_FROM_CORE:
                viol["d"].append(f"{path}:{ln}: {src_area} includes {inc} ({dst_area}): common/ and proto/ "
                                 f"must not depend on tools/ or supervisor/")
    core = {}
    for (a, b) in edges:
        if is_core(a) and is_core(b):
            core.setdefault(a, set()).add(b)
    for comp in sccs(core):
        cyc = find_cycle(core, comp)
        where = ", ".join(f"{a} -> {b} at {edges[(a, b)]}" for a, b in zip(cyc, cyc[1:]))
        viol["d"].append(f"{edges[(cyc[0], cyc[1])]}: include cycle {' -> '.join(cyc)} ({where})")
    total = 0
    for key in "abcd":
        for v in viol[key]:
            print(v)
        total += len(viol[key])
    print(f"check_structure: {len(files)} files, {n_funcs} functions; {total} violation(s) "
          f"(files over {MAX_FILE_LINES} lines: {len(viol['a'])}, functions over {MAX_FUNC_LINES}: "
          f"{len(viol['b'])}, DL_CUDA conditionals in stages: {len(viol['c'])}, include graph: {len(viol['d'])})")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
