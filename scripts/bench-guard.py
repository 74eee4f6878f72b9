"""Compares the guard's short benchmark runs with their bounds (scripts/bench-guard.json).

Each bound names a report, a path into its JSON (`*` takes the best of the values there:
the largest for `at_least`, the smallest for `at_most`), the documented figure and where it
is documented, and the bound itself: a floor at least 5x below the documented figure, or a
ceiling at least 5x above it, or an absolute bound the issue that set it names. Every figure
is printed, met or not; the exit status is 1 when any bound is crossed.
"""
import json
import sys
from pathlib import Path


def values(node, parts):
    if not parts:
        yield node
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            yield from values(child, rest)
    elif isinstance(node, list):
        yield from values(node[int(head)], rest)
    elif isinstance(node, dict) and head in node:
        yield from values(node[head], rest)


def main():
    bounds = json.loads(Path(sys.argv[1]).read_text())
    reports = Path(sys.argv[2])
    crossed = 0
    print(f"{'figure':58} {'measured':>11} {'bound':>13} {'documented':>11}")
    for bound in bounds["bounds"]:
        report = json.loads((reports / f"{bound['report']}.json").read_text())
        found = [v for v in values(report, bound["path"].split(".")) if isinstance(v, (int, float))]
        name = f"{bound['report']}: {bound['name']}"
        if not found:
            print(f"{name:58} {'missing':>11}")
            crossed += 1
            continue
        if "at_least" in bound:
            measured, limit, ok = max(found), bound["at_least"], max(found) >= bound["at_least"]
            shown = f">= {limit:g}"
        else:
            measured, limit, ok = min(found), bound["at_most"], min(found) <= bound["at_most"]
            shown = f"<= {limit:g}"
        documented = bound.get("documented")
        print(
            f"{name:58} {measured:>11.4g} {shown:>13} {documented if documented is not None else '-':>11}"
            + ("" if ok else "   CROSSED")
        )
        crossed += 0 if ok else 1
    if crossed:
        print(f"bench-guard: {crossed} bound(s) crossed: a speed regression, or a machine far "
              "slower than any this project has measured on (see docs/benchmarks.md)",
              file=sys.stderr)
        sys.exit(1)
    print("bench-guard: every figure within its bound")


main()
