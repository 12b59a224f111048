"""One SparkSession for the whole test run (the JVM takes seconds to start on two shared cores).

Test modules import the fixture: `from tests.harness.spark_session import spark  # noqa: F401`.

The tests' frames have tens of rows, so a test's time is the driver's per-job work, not the data: the session
runs with the settings for that (tests only; the product's session is analytics.spark's, which
tests/processes/test_analytics_e2e.py runs through the CLI). Measured on tests/unit/test_analytics_driver.py (two cores shared
with other work, so roughly): ~72 s with the product's settings, 50 s without code generation and with one shuffle
partition, 43 s also without adaptive execution (which re-plans after every shuffle stage). Neither changes a result: interpreted
and generated code compute the same rows (summary._interpreted relies on it too), and so do both plans.
"""

from __future__ import annotations

import shutil

import pytest

TEST_SETTINGS = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
}


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None:
        pytest.fail("the analytics tests need Java (bash .ci/setup installs default-jre-headless)")
    from pairmq.analytics.spark import log_path, session

    s = session(app="pairmq-tests", shuffle_partitions=1)
    for key, value in TEST_SETTINGS.items():
        s.conf.set(key, value)
    yield s
    s.stop()
    log_path().unlink(missing_ok=True)  # the JVM's output: the tests' failures say what they need
