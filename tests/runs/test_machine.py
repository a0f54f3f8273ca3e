import json

from klppo.runs.rundir import machine, write_metadata


def test_metadata_records_the_machine(tmp_path):
    m = machine()
    assert set(m) == {"cpu", "cpu_count", "arch", "gpu"}
    assert isinstance(m["cpu_count"], int) and m["cpu_count"] >= 1 and m["arch"]
    write_metadata(tmp_path)
    assert json.loads((tmp_path / "metadata.json").read_text())["machine"] == m
