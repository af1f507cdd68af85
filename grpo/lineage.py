"""Each DVC stage's code deps, computed from the import graph and checked against dvc.yaml.

A stage runs ``python -m stages.<name>``. The code that can shape its outputs is every project module
that run can execute: the transitive closure of its import statements, at module level and inside
functions alike (the lazily imported engines count), with the ``__init__.py`` of every package on
the way, and the sibling scripts a module starts by file name (``grpo/verify/latex_worker.py``). Not
counted: imports under ``if TYPE_CHECKING:`` (they never run) and modules that hold nothing but a
docstring (no edit to one can change an output).

dvc.yaml lists code deps by hand, so that they stay readable: a package folder where a stage runs
every module in it, single files otherwise. ``check`` compares the two both ways: a module the stage
runs but does not list leaves stale outputs after an edit (``dvc repro`` would report nothing to do),
a listed module it never runs reruns it for nothing. ``python -m grpo.lineage`` prints each stage's
deps as they should be, ``--check`` exits 1 naming each stage and file that differ.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
_MODULE_CMD = re.compile(r"\bpython\s+-m\s+([\w.]+)")
_SCRIPT_NAME = re.compile(r"^\w+\.py$")


def module_file(root: Path, dotted: str) -> Path | None:
    """The file that ``import dotted`` runs, relative to ``root``, or None when it is not project code."""
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(root)
    return None


def _with_parents(root: Path, dotted: str) -> list[Path]:
    """``a.b.c`` runs a/__init__.py, a/b/__init__.py and a/b/c.py: every one that is project code."""
    parts = dotted.split(".")
    found = (module_file(root, ".".join(parts[:i])) for i in range(1, len(parts) + 1))
    return [f for f in found if f is not None]


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
        or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (their ``else`` still runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _is_type_checking(node):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _package_of(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1])


def direct_deps(root: Path, path: Path) -> set[Path]:
    """The project files that running ``path`` (relative to ``root``) runs directly."""
    tree = ast.parse((root / path).read_text(encoding="utf-8"), filename=str(path))
    package = _package_of(path)
    found: set[Path] = set()
    for node in _nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.update(_with_parents(root, alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: level 1 is this module's package, each further level one up
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.update(_with_parents(root, base))
            for alias in node.names:  # ``from pkg import submodule`` runs the submodule
                found.update(_with_parents(root, f"{base}.{alias.name}") if alias.name != "*" else [])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _SCRIPT_NAME.match(node.value):
            script = path.parent / node.value  # a sibling script started as a subprocess
            if (root / script).is_file():
                found.add(script)
    found.discard(path)
    return found


def is_trivial(root: Path, path: Path) -> bool:
    """A module with nothing but a docstring: it runs, but no edit to it can change an output."""
    body = ast.parse((root / path).read_text(encoding="utf-8")).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def closure(root: Path, entry: str) -> dict[Path, Path | None]:
    """Every non-trivial project file that ``python -m entry`` runs, mapped to the file that first
    imports it (None for the entry), so a message can say how a stage reaches a module."""
    start = module_file(root, entry)
    if start is None:
        raise ValueError(f"module {entry!r} is not a file under {root}")
    parents: dict[Path, Path | None] = {p: None for p in _with_parents(root, entry)}
    queue = list(parents)
    while queue:
        path = queue.pop()
        for dep in sorted(direct_deps(root, path)):
            if dep not in parents:
                parents[dep] = path
                queue.append(dep)
    return {p: via for p, via in parents.items() if not is_trivial(root, p)}


def python_files(root: Path, dep: str) -> set[Path]:
    """The .py files a dvc.yaml dep covers (a file, or every .py under a folder)."""
    target = root / dep
    if target.is_dir():
        return {p.relative_to(root) for p in target.rglob("*.py") if "__pycache__" not in p.parts}
    return {Path(dep)} if target.suffix == ".py" and target.is_file() else set()


def is_package(folder: Path) -> bool:
    """A folder of Python modules (``__init__.py`` or not: grpo/train is a namespace package)."""
    return folder.is_dir() and any(folder.glob("*.py"))


def is_code_dep(root: Path, dep: str) -> bool:
    target = root / dep
    return target.suffix == ".py" or is_package(target)


@dataclass(frozen=True)
class Stage:
    name: str  # the dvc.yaml key (a matrix stage is checked once: every item runs the same module)
    module: str  # what ``python -m`` runs
    code_deps: list[str]


def stages(root: Path) -> list[Stage]:
    spec = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    found = []
    for name, stage in spec["stages"].items():
        match = _MODULE_CMD.search(stage["cmd"])
        if match is None:
            raise ValueError(f"dvc.yaml stage {name!r}: cmd {stage['cmd']!r} is not `python -m <module>`")
        deps = [d for d in stage.get("deps", []) if "${" not in d and is_code_dep(root, d)]
        found.append(Stage(name, match.group(1), deps))
    return found


def suggested_deps(root: Path, files: set[Path]) -> list[str]:
    """The shortest dep list covering exactly ``files``: a folder where they hold every non-trivial
    module under it, single files elsewhere."""
    result: set[str] = set()
    for path in files:
        chosen = path
        for folder in path.parents:
            if folder == Path(".") or not is_package(root / folder):
                break
            if all(p in files or is_trivial(root, p) for p in python_files(root, str(folder))):
                chosen = folder
        result.add(chosen.as_posix())
    return sorted(result)


def _chain(reached: dict[Path, Path | None], path: Path) -> str:
    hops = [path]
    while reached[hops[-1]] is not None:
        hops.append(reached[hops[-1]])
    return " <- ".join(str(p) for p in hops)


def check(root: Path = ROOT) -> list[str]:
    """One line per difference between dvc.yaml's code deps and the import closure of each stage."""
    problems = []
    for stage in stages(root):
        reached = closure(root, stage.module)
        covered = {p: dep for dep in stage.code_deps for p in python_files(root, dep)}
        for path in sorted(set(reached) - set(covered)):
            problems.append(f"stage {stage.name!r} runs {path} but dvc.yaml does not list it in its deps "
                            f"(imported via {_chain(reached, path)})")
        for dep in stage.code_deps:
            unused = sorted(p for p in python_files(root, dep) if p not in reached and not is_trivial(root, p))
            if unused:
                problems.append(f"stage {stage.name!r} lists {dep} in its deps but never runs "
                                f"{', '.join(map(str, unused))}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when dvc.yaml differs from the imports")
    args = parser.parse_args()
    if args.check:
        problems = check()
        for line in problems:
            print(line)
        if problems:
            print("fix: put each stage's list from `python -m grpo.lineage` into its dvc.yaml deps")
        sys.exit(1 if problems else 0)
    for stage in stages(ROOT):
        print(f"{stage.name}:")
        deps = suggested_deps(ROOT, set(closure(ROOT, stage.module)))
        for dep in sorted(deps, key=lambda d: not d.startswith("stages/")):  # the stage script first
            print(f"  - {dep}")


if __name__ == "__main__":
    main()
