"""The installer's package spec with extras, and the missing-extra sentence (cli/install_software.py, cli/extras.py)."""

from __future__ import annotations

import pytest

from pairmq.cli import extras
from pairmq.cli.install_software import with_extras


@pytest.mark.parametrize("spec, wanted, expected", [
    ("pairmq", ("vip",), "pairmq[vip]"),
    ("pairmq==0.1.0", ("vip",), "pairmq[vip]==0.1.0"),
    ("pairmq[analytics]>=0.1", ("vip",), "pairmq[analytics,vip]>=0.1"),
    ("/srv/src/pairmq", ("vip",), "/srv/src/pairmq[vip]"),
    ("./dist/pairmq-0.1.0-py3-none-any.whl", ("vip",), "./dist/pairmq-0.1.0-py3-none-any.whl[vip]"),
    ("pairmq==0.1.0", (), "pairmq==0.1.0"),
])
def test_extras_are_added_to_names_paths_and_wheels(spec, wanted, expected):
    assert with_extras(spec, wanted) == expected


def test_a_missing_extra_is_one_sentence_naming_the_pip_command(monkeypatch):
    monkeypatch.setitem(extras.EXTRAS, "vip", ("the virtual IP", ("pyroute2", "no_such_module_here")))
    with pytest.raises(extras.MissingExtra) as refused:
        extras.require("vip")
    assert str(refused.value) == ("the virtual IP needs the vip extra (no_such_module_here not installed): "
                                  "run pip install 'pairmq[vip]'")
    assert refused.value.exit_code == 2
    extras.require("analytics")  # this venv has it (the test extra includes it): no refusal
