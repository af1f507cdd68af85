"""dvc.yaml's code deps against each stage's import closure (grpo/lineage.py): the real dvc.yaml, the
closure rules on a small hand-made project, and the static closure against what Python really imports."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from grpo.lineage import check, closure, is_trivial, stages, suggested_deps
from tests.conftest import ROOT
from tests.pipeline.project import run


def test_dvc_yaml_code_deps_are_each_stages_import_closure():
    problems = check(ROOT)
    assert not problems, ("dvc.yaml's code deps differ from what the stages import:\n" + "\n".join(problems)
                          + "\nfix: `python -m grpo.lineage` prints each stage's deps as they should be; copy "
                            "the stage's list into its `deps:` in dvc.yaml (data deps stay as they are)")


def test_the_readme_commands_print_and_check_the_deps():
    printed = run("python -m grpo.lineage", ROOT).stdout
    # grpo/config.py validates choices against the places that name them (the objective's variants, data
    # registry, prompt styles, rollout interface, SENT orders, rewards), so every stage that reads params
    # depends on them; and importing grpo runs grpo/__init__.py, which calls grpo/hardware.py
    assert ("eval_summary:\n  - stages/eval_summary.py\n  - grpo/__init__.py\n  - grpo/algo/choices.py\n"
            "  - grpo/cli.py\n  - grpo/config.py\n  - grpo/data/answers.py\n  - grpo/data/errors.py\n"
            "  - grpo/data/registry.py\n  - grpo/data/synthetic.py\n  - grpo/distributed.py\n  - grpo/eval/metrics.py\n"
            "  - grpo/eval/summary.py\n"
            "  - grpo/fault_injection.py\n  - grpo/hardware.py\n  - grpo/io.py\n  - grpo/launch.py\n"
            "  - grpo/prompts.py\n"
            "  - grpo/rollout/base.py\n  - grpo/sent/curriculum.py\n  - grpo/slots.py\n  - grpo/verify\n"
            "report:\n") in printed
    assert run("python -m grpo.lineage --check", ROOT).stdout == ""


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


# A project small enough to work out by hand. ``stages/s.py`` reaches: pkg/__init__ (trivial: not
# counted), pkg/a (module level), pkg/b (inside a function), pkg/c (relative, ``from . import c``),
# pkg/sub/d via ``from pkg.sub import d`` with pkg/sub/__init__ (it imports e), pkg/worker.py (a
# sibling script named in a string); not pkg/typing_only (only under TYPE_CHECKING) nor pkg/unused.
TOY = {
    "stages/__init__.py": "",
    "stages/s.py": "import json\nfrom pkg import a\n",
    "pkg/__init__.py": '"""A docstring only."""\n',
    "pkg/a.py": """\
        from __future__ import annotations
        from typing import TYPE_CHECKING
        from . import c
        if TYPE_CHECKING:
            from pkg import typing_only
        else:
            import os
        def lazy():
            import pkg.b
            return pkg.b
        """,
    "pkg/b.py": "from pkg.sub import d\n",
    "pkg/c.py": "WORKER = 'worker.py'\n",
    "pkg/worker.py": "print('child')\n",
    "pkg/typing_only.py": "X = 1\n",
    "pkg/unused.py": "Y = 2\n",
    "pkg/sub/__init__.py": "from pkg.sub.e import E\n",
    "pkg/sub/d.py": "D = 1\n",
    "pkg/sub/e.py": "E = 1\n",
}
TOY_CLOSURE = {"stages/s.py", "pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/worker.py", "pkg/sub/__init__.py",
               "pkg/sub/d.py", "pkg/sub/e.py"}


def test_closure_follows_lazy_relative_and_script_imports_but_not_type_checking(tmp_path):
    write(tmp_path, TOY)
    reached = closure(tmp_path, "stages.s")
    assert {str(p) for p in reached} == TOY_CLOSURE
    assert reached[Path("pkg/sub/d.py")] == Path("pkg/b.py")  # who imports it, for the message
    assert is_trivial(tmp_path, Path("pkg/__init__.py")) and not is_trivial(tmp_path, Path("pkg/c.py"))
    # pkg/sub and stages/ run whole (stages/__init__.py is trivial): folders; pkg/ does not (unused, typing_only)
    assert suggested_deps(tmp_path, set(reached)) == ["pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/sub",
                                                      "pkg/worker.py", "stages"]


def test_check_names_the_stage_and_the_file_both_ways(tmp_path):
    write(tmp_path, TOY)
    (tmp_path / "dvc.yaml").write_text(textwrap.dedent("""\
        stages:
          good:
            cmd: python -m stages.s --flag
            deps: [stages/s.py, pkg/a.py, pkg/b.py, pkg/c.py, pkg/worker.py, pkg/sub, data/input.txt]
          bad:
            matrix: {x: [1, 2]}
            cmd: python -m stages.s --x ${item.x}
            deps: [stages/s.py, pkg, "data/${item.x}.txt"]
        """))
    assert [(s.name, s.module) for s in stages(tmp_path)] == [("good", "stages.s"), ("bad", "stages.s")]
    problems = check(tmp_path)
    # "bad" lists the whole pkg folder: it covers everything the stage runs, and two modules it never runs
    assert problems == ["stage 'bad' lists pkg in its deps but never runs pkg/typing_only.py, pkg/unused.py"]
    (tmp_path / "dvc.yaml").write_text((tmp_path / "dvc.yaml").read_text().replace(
        "deps: [stages/s.py, pkg/a.py, pkg/b.py,", "deps: [stages/s.py, pkg/a.py,"))
    assert check(tmp_path) == [
        "stage 'good' runs pkg/b.py but dvc.yaml does not list it in its deps (imported via pkg/b.py <- pkg/a.py "
        "<- stages/s.py)",
        "stage 'bad' lists pkg in its deps but never runs pkg/typing_only.py, pkg/unused.py"]


# Imports each stage module in turn in a fresh child, after dropping the project's modules, and prints
# the project files Python really loaded: module-level imports only (lazy ones run later), so this
# set must be inside the static closure, and a miss would show a rule the AST walk gets wrong.
RUNTIME_PROBE = """
import importlib, json, sys
from pathlib import Path
root = Path.cwd().resolve()
loaded = {}
for module in sys.argv[1:]:
    for name in [n for n in sys.modules if n.split(".")[0] in ("grpo", "stages")]:
        del sys.modules[name]
    importlib.import_module(module)
    files = (getattr(m, "__file__", None) for n, m in sys.modules.items() if n.split(".")[0] in ("grpo", "stages"))
    loaded[module] = sorted(str(Path(f).resolve().relative_to(root)) for f in files if f)
print(json.dumps(loaded))
"""


def test_static_closure_contains_every_module_python_imports():
    modules = sorted({s.module for s in stages(ROOT)})
    out = subprocess.run([sys.executable, "-c", RUNTIME_PROBE, *modules], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    loaded = json.loads(out.splitlines()[-1])
    for module, files in loaded.items():
        static = {str(p) for p in closure(ROOT, module)}
        runtime = {f for f in files if not is_trivial(ROOT, Path(f))}
        assert runtime <= static, (module, sorted(runtime - static))
        assert len(runtime) >= 4, (module, runtime)  # the probe saw real imports (cli, config, io, ...)
