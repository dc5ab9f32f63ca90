"""No module of the package imports a name from the package root (issue 56, point 1).

``from .. import X`` inside the package is fine when ``X`` is a module or a package (it loads
that module); a name that ``__init__.py`` defines or re-exports (``__version__``, ``task``,
``Limit``) makes the module import the whole public face, a circle through every layer. The
version comes from the installed metadata instead.
"""

from __future__ import annotations

import ast
import pathlib

import django_jobguard

PACKAGE = pathlib.Path(django_jobguard.__file__).parent


def _root_names_imported() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "__init__.py":
            continue
        depth = len(path.relative_to(PACKAGE).parts) - 1  # folders between the root and the file
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            absolute_root = node.level == 0 and node.module == "django_jobguard"
            relative_root = node.level == depth + 1 and node.module is None
            if not (absolute_root or relative_root):
                continue
            for alias in node.names:
                name = alias.name
                if not ((PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists()):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports {name!r}")
    return found


def test_no_module_imports_a_name_of_the_package_root():
    assert _root_names_imported() == []


def test_the_installed_version_is_the_packages():
    from django_jobguard.api.schema import SCHEMA_SETTINGS

    assert SCHEMA_SETTINGS["VERSION"] == django_jobguard.__version__
