"""The wheel holds every subpackage: pyproject.toml lists them by name under the pairmq namespace (setuptools'
package-dir maps each top folder), so a new folder that is not listed would be missing from a non-editable install."""

import pathlib
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[2]
TOP = ("appliance", "mate_link", "configsync", "monitor", "cli", "analytics")
DATA = ("systemd", "docs")  # package data only (the units and the docs they name): one __init__.py each


def test_every_folder_with_an_init_is_a_listed_package_and_every_top_folder_is_mapped():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"pairmq." + ".".join(init.parent.relative_to(REPO).parts)
               for top in (*TOP, *DATA) for init in (REPO / top).rglob("__init__.py")}
    assert folders == set(setuptools["packages"])
    assert setuptools["package-dir"] == {f"pairmq.{top}": top for top in (*TOP, *DATA)}
