"""analytics/spark.py before any JVM: which master, which java, and the class-data archive's life cycle."""

from __future__ import annotations

import os

import pytest

from pairmq.analytics import spark


def test_the_master_is_the_given_one_else_sparks_own_else_local(tmp_path, monkeypatch):
    for name in ("MASTER", "SPARK_CONF_DIR", "SPARK_HOME", "PYSPARK_GATEWAY_PORT", "PYSPARK_SUBMIT_ARGS"):
        monkeypatch.delenv(name, raising=False)
    assert spark.master_for(None) == "local[2]"
    assert spark.master_for("spark://head:7077") == "spark://head:7077"
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("# comment\nspark.executor.memory 2g\nspark.master\tyarn\n")
    assert spark.configured_master({"SPARK_CONF_DIR": str(conf)}) == "yarn"
    assert spark.configured_master({"SPARK_HOME": str(tmp_path)}) == "yarn"  # $SPARK_HOME/conf
    assert spark.configured_master({"MASTER": "local[3]", "SPARK_CONF_DIR": str(conf)}) == "local[3]"
    assert spark.configured_master({"SPARK_CONF_DIR": str(tmp_path / "none")}) is None
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert spark.master_for(None) is None  # Spark reads it itself
    assert spark.master_for("local[1]") == "local[1]"  # --master wins
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # under spark-submit: its master
    assert spark.master_for(None) is None


def test_no_java_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(spark.SparkSetupError) as got:
        spark.java()
    assert str(got.value) == (f"pairmq analytics needs a Java runtime (17 or later) and found no $JAVA_HOME/bin/java "
                              f"({tmp_path}): install one (e.g. apt install default-jre-headless)")
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(spark.SparkSetupError, match="found no java on PATH"):
        spark.java()


def test_the_class_archive_is_written_once_then_mapped(tmp_path):
    java = str(tmp_path / "java")
    first = spark.class_archive(java, tmp_path)
    assert first.startswith("-XX:ArchiveClassesAtExit=") and first.endswith(".tmp -Xlog:disable")
    written = first.split("=", 1)[1].split()[0]
    assert spark.class_archive(java, tmp_path).startswith("-XX:ArchiveClassesAtExit=")  # nothing written yet
    with open(written, "wb") as f:
        f.write(b"\0" * 64)  # the JVM writes the header last: still being written
    assert spark.class_archive(java, tmp_path).startswith("-XX:ArchiveClassesAtExit=")
    with open(written, "r+b") as f:
        f.write((0xF00BABA8).to_bytes(4, "little"))
    final = written.rsplit(".", 2)[0]
    assert spark.class_archive(java, tmp_path) == f"-XX:SharedArchiveFile={final} -Xlog:disable"
    assert os.path.exists(final) and not os.path.exists(written)
    assert spark.class_archive(str(tmp_path / "other-java"), tmp_path).startswith("-XX:ArchiveClassesAtExit=")
