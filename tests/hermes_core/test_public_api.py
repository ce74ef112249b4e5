"""hermes_core's public face is true, and the layers import downwards only.

What ``flows/``, ``tasks/`` and ``bench/`` use of hermes_core is what hermes_core exports: no
private module (``_x.py``) or private name (``_x``), and every imported name is in the
``__all__`` of the module it comes from (or is a public submodule of that package). hermes_core
imports nothing of ``flows``, ``tasks`` or Prefect; ``tasks`` imports nothing of ``flows``
(docs/architecture.md). The lazy map of ``hermes_core/__init__.py`` names the module that
defines each name.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS = ("flows", "tasks", "bench")


def python_files(*folders: str) -> list[Path]:
    """Every ``.py`` file under the given folders of the repository, sorted."""
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def imports(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` of every absolute import in ``path``, at any depth (``name`` None: ``import module``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
    return found


def hermes_core_uses() -> list[tuple[str, str, str | None]]:
    """``(where, module, name)`` of every import of hermes_core in flows/, tasks/ and bench/."""
    return [
        (f"{path.relative_to(ROOT)}:{line}", module, name)
        for path in python_files(*CONSUMERS)
        for line, module, name in imports(path)
        if module.split(".")[0] == "hermes_core"
    ]


def is_private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def test_the_consumers_import_hermes_core():
    """The scan sees the imports (a broken walk would pass every check below vacuously)."""
    modules = {module for _, module, _ in hermes_core_uses()}
    assert {
        "hermes_core",
        "hermes_core.runner",
        "hermes_core.runfolder.folder",
        "hermes_core.tools",
    } <= modules


def test_flows_tasks_and_bench_import_no_private_module_or_name():
    private = [
        f"{where}: {module}{'' if name is None else ' import ' + name}"
        for where, module, name in hermes_core_uses()
        if is_private(module) or (name is not None and name.startswith("_"))
    ]
    assert private == []


def test_every_name_they_import_is_exported_by_its_module():
    """Each ``from hermes_core.x import name`` names an entry of ``hermes_core.x.__all__`` (or a public submodule)."""
    missing = []
    for where, module, name in hermes_core_uses():
        if name is None:
            continue
        exported = getattr(importlib.import_module(module), "__all__", None)
        if exported is None:
            missing.append(f"{where}: {module} has no __all__")
        elif name not in exported and importlib.util.find_spec(f"{module}.{name}") is None:
            missing.append(f"{where}: {name} is not in {module}.__all__")
    assert missing == []


def test_every_public_hermes_core_module_declares_all_and_it_resolves():
    """``__all__`` lists names the module has, once each: a stale entry would break ``import *``."""
    problems = []
    for path in python_files("hermes_core"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if is_private(module.replace("__main__", "main")):
            continue
        exported = getattr(importlib.import_module(module), "__all__", None)
        if exported is None:
            problems.append(f"{module}: no __all__")
            continue
        loaded = importlib.import_module(module)
        problems += [
            f"{module}.__all__: {name} does not resolve" for name in exported if not hasattr(loaded, name)
        ]
        problems += [f"{module}.__all__: private {name}" for name in exported if name.startswith("_")]
        if len(set(exported)) != len(exported):
            problems.append(f"{module}.__all__ lists a name twice")
    assert problems == []


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [("hermes_core", ("flows", "tasks", "prefect")), ("tasks", ("flows",))],
)
def test_layers_import_downwards_only(folder, forbidden):
    """hermes_core imports nothing of flows/, tasks/ or Prefect (any prefect* package); tasks/ nothing of flows/."""
    upward = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in python_files(folder)
        for line, module, _ in imports(path)
        if any(module.split(".")[0] == top or module.startswith(f"{top}_") for top in forbidden)
    ]
    assert upward == []


def test_hermes_core_does_not_import_prefect():
    """At run time too: importing every hermes_core module loads no Prefect, flows or tasks module."""
    code = (
        "import importlib, pkgutil, sys, hermes_core\n"
        "for m in pkgutil.walk_packages(hermes_core.__path__, 'hermes_core.'):\n"
        "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] in ('prefect', 'flows', 'tasks')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"


def defined_names(module: str) -> set[str]:
    """Names ``module`` owns: bound at its top level by def, class or assignment, or, for a package,
    re-exported from one of its own private modules (``hermes_core.tools`` owns ``tools._registry``'s names)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    names = set()
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"{module}._"):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def test_the_lazy_map_points_at_the_defining_modules():
    """``hermes_core._PUBLIC`` maps each public name to the module that defines it, and each entry resolves."""
    import hermes_core

    assert hermes_core.__all__ == sorted(hermes_core._PUBLIC)
    wrong = [
        f"{name}: not defined in {module}"
        for name, module in hermes_core._PUBLIC.items()
        if name not in defined_names(module)
    ]
    assert wrong == []
    for name, module in hermes_core._PUBLIC.items():
        assert getattr(hermes_core, name) is getattr(importlib.import_module(module), name), name
        assert name in importlib.import_module(module).__all__, f"{name} is not in {module}.__all__"
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        hermes_core.nope  # noqa: B018 - the lookup is the test
