"""The package's layout: no import cycles, the documented import paths exist, scripts use only public names."""

import ast
import importlib
import json
import re
import runpy
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "eagle3_hf"
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "notebooks").glob("*.ipynb"))]
DOCUMENTS += [PACKAGE / "checkpoints" / "templates" / "model_card.md"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `path` imports anywhere in it (function-local imports included)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            candidates = [origin] + [f"{origin}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(candidate for candidate in candidates if candidate in modules and candidate != name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported_modules(path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_package_modules_import_each_other():
    """Not even through function-local imports, and not around a longer loop either."""
    graph = import_graph()
    mutual = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    assert mutual == []
    assert cycles(graph) == []


def test_subpackages_group_the_concerns():
    top_level = sorted(path.stem for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
    assert top_level == [
        "assets", "atomic", "cli", "configuration_eagle3", "cpu_features", "loading", "modeling_eagle3", "target",
        "vocab_maps",
    ]  # fmt: skip
    for subpackage in ("bench", "checkpoints", "commands", "generation", "training"):
        assert (PACKAGE / subpackage / "__init__.py").is_file()


def documented_imports() -> list[tuple[str, str, str]]:
    """`(document, module, name)` for every `from eagle3_hf... import name` in the docs, notebooks and card."""
    found = []
    pattern = re.compile(r"^\s*from (eagle3_hf[\w.]*) import \(?([^)\n#]*)", re.M)
    for document in DOCUMENTS:
        text = document.read_text()
        if document.suffix == ".ipynb":
            cells = json.loads(text)["cells"]
            text = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
        for module, names in pattern.findall(text):
            for name in names.split(","):
                name = name.strip().split(" as ")[0]
                if name:
                    found.append((document.name, module, name))
    return found


def documented_dotted_names() -> list[tuple[str, str]]:
    """`(document, "eagle3_hf.x.y")` for every dotted path written in the prose of the docs and the card."""
    found = []
    for document in DOCUMENTS:
        for path in re.findall(r"`(eagle3_hf(?:\.\w+)+)", document.read_text()):
            found.append((document.name, path))
    return found


def test_every_import_the_docs_show_works():
    imports = documented_imports()
    assert len(imports) > 30  # the docs, notebooks and card do show imports
    failures = []
    for document, module, name in imports:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as error:
            failures.append(f"{document}: from {module} import {name}: {error}")
    assert failures == []


def test_every_dotted_path_the_docs_name_exists():
    failures = []
    names = documented_dotted_names()
    assert len(names) > 20  # the docs do name dotted paths (a broken pattern would find none and check nothing)
    for document, path in names:
        parts = path.split(".")
        for split in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                value = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            try:
                for attribute in parts[split:]:
                    value = getattr(value, attribute)
            except AttributeError:
                failures.append(f"{document}: {path}")
            break
        else:
            failures.append(f"{document}: {path}")
    assert failures == []


def documented_repository_paths() -> list[tuple[str, str]]:
    """`(document, "scripts/x.py")` for every path into the repository's own folders written in backticks in the docs,
    the card and the data README (a path may be followed by arguments or a `:line`)."""
    documents = [*DOCUMENTS, *sorted((ROOT / "model_cards").glob("*/README.md")), ROOT / "data/regenerated/README.md"]
    pattern = re.compile(r"`(?:python )?((?:eagle3_hf|scripts|tests|docs|model_cards|notebooks)/[\w./-]*[\w/])")
    return [(document.name, path) for document in documents for path in pattern.findall(document.read_text())]


def test_every_repository_path_the_docs_name_exists():
    paths = documented_repository_paths()
    assert len(paths) > 20  # the docs do name files
    assert [f"{document}: {path}" for document, path in paths if not (ROOT / path).exists()] == []


def test_package_data_ships_every_file_the_package_reads():
    """A wheel carries only `.py` files and the globs of `[tool.setuptools.package-data]`: the model card template
    (`checkpoints/templates/model_card.md`) was once listed as `templates/*` and left out of every non-editable install."""
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["eagle3_hf"]
    shipped = {path for pattern in globs for path in PACKAGE.glob(pattern) if path.is_file()}
    data_files = {path for path in PACKAGE.rglob("*") if path.is_file() and path.suffix not in (".py", ".pyc")}
    assert PACKAGE / "checkpoints" / "templates" / "model_card.md" in data_files
    assert sorted(str(path.relative_to(PACKAGE)) for path in data_files - shipped) == []


def test_the_top_level_public_names():
    import eagle3_hf

    assert len(eagle3_hf.__all__) > 10
    for name in eagle3_hf.__all__:
        value = getattr(eagle3_hf, name)  # raises for a name listed but missing
        assert getattr(value, "__name__", name) == name  # a class or function is exported under its own name


@pytest.mark.parametrize("script", SCRIPTS, ids=[script.name for script in SCRIPTS])
def test_scripts_use_only_public_names(script):
    """Scripts import public names and patch nothing: a rename inside the package breaks them loudly, here."""
    tree = ast.parse(script.read_text())
    modules = package_modules()
    private, patched = [], []
    package_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eagle3_hf"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    private.append(f"{node.module}.{alias.name}")
                if f"{node.module}.{alias.name}" in modules:
                    package_aliases.add(alias.asname or alias.name)
                else:
                    exported = getattr(importlib.import_module(node.module), "__all__", None)
                    if exported is not None and alias.name not in exported:
                        private.append(f"{node.module}.{alias.name} (not in __all__)")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in package_aliases:
                private.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            patched.append(ast.unparse(node))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                    if target.value.id in package_aliases:
                        patched.append(ast.unparse(target))
    assert private == [] and patched == []


@pytest.mark.parametrize("script", SCRIPTS, ids=[script.name for script in SCRIPTS])
def test_scripts_answer_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))  # as `python scripts/x.py` runs it: scripts import each other
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out
