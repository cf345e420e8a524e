"""The layout guards itself: the repository root is the `goaltender` package (pyproject.toml's
package-dir), so setuptools ships only the packages pyproject lists. A new folder of modules left off
that list would work in the checkout and be missing from every installed wheel. And a module grows
past ~600 lines only with its opening note saying why (issue 33)."""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_SHIPPED = {"tests", "benchmarks", "build", "dist", "docs", "deploy", "skills"}  # or shipped as data


def _module_folders() -> set[str]:
    folders = set()
    for folder, subfolders, files in os.walk(ROOT):
        relative = Path(folder).relative_to(ROOT)
        if not relative.parts:  # the root: its folders of data and its hidden ones (.venv) are not walked
            subfolders[:] = [
                name for name in subfolders if name not in NOT_SHIPPED and not name.startswith(".")
            ]
        if any(name.endswith(".py") for name in files):
            folders.add(".".join(("goaltender", *relative.parts)))
    return folders


def test_every_folder_of_modules_is_a_package_the_wheel_ships():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = _module_folders()
    assert found - listed == set(), (
        f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
    )
    assert listed - found == set(), (
        f"listed in pyproject.toml but no such folder of modules: {sorted(listed - found)}"
    )
    for package in listed:
        init = ROOT.joinpath(*package.split(".")[1:], "__init__.py")
        assert init.is_file(), f"{package} has no __init__.py: {init}"


LONG_MODULE = 600  # lines


def _product_modules() -> list[Path]:
    return [
        ROOT.joinpath(*package.split(".")[1:], name)
        for package in sorted(_module_folders())
        for name in os.listdir(ROOT.joinpath(*package.split(".")[1:]))
        if name.endswith(".py")
    ]


def test_a_module_past_600_lines_says_why_in_its_opening_note():
    unexplained = []
    for path in _product_modules():
        text = path.read_text()
        if text.count("\n") > LONG_MODULE and "600 lines" not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert unexplained == [], (
        "split these by concern, or say in their opening note why they stay one module past "
        f"{LONG_MODULE} lines: {unexplained}"
    )
