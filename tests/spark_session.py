"""One SparkSession for the whole test run (the JVM takes seconds to start on two shared cores).

Test modules import the fixture: `from tests.spark_session import spark  # noqa: F401`.
"""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None:
        pytest.fail("the analytics tests need Java (bash .ci/setup installs default-jre-headless)")
    from analytics.spark import session

    s = session(app="pairmq-tests", shuffle_partitions=2)
    yield s
    s.stop()
