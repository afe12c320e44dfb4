"""``einsummable plan``: the cluster from a calibration file, memory per machine from --memory."""

from einsummable import cli
from einsummable.hardware.cluster import Cluster

TINY = ["plan", "--model", "tiny", "--batch", "2", "--seq", "8"]


def test_plan_reads_the_cluster_file_and_memory_overrides_it(tmp_path, capsys):
    path = tmp_path / "cluster.json"
    Cluster(machines=2, cores=3, memory_per_machine=3 * 2**30).to_json(path)
    assert cli.main([*TINY, "--cluster", str(path)]) == 0
    out = capsys.readouterr().out
    assert "on 2 x 3 workers, 3 GiB per machine" in out and "fsdp" in out and "peak" in out
    assert cli.main([*TINY, "--cluster", str(path), "--machines", "4", "--memory", "512MiB"]) == 0
    assert "on 4 x 3 workers, 0.5 GiB per machine" in capsys.readouterr().out


def test_plan_that_cannot_fit_says_what_it_needs(capsys):
    assert cli.main([*TINY, "--machines", "2", "--cores", "2", "--memory", "1KiB"]) == 2
    err = capsys.readouterr().err
    assert "no plan fits" in err and "GiB = inputs" in err
    assert cli.main([*TINY, "--memory", "lots"]) == 2
    assert "expected a number and a unit" in capsys.readouterr().err
