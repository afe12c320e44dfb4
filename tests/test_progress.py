"""The progress bar: an ETA, a redrawn line that clears what it overwrites, tqdm when
installed; the Python Trainer's callback and progress option."""

import re

import numpy as np
import pytest

from einsummable import progress
from einsummable.progress import Progress
from fakes import Terminal


def test_our_own_bar_clears_the_line_and_shows_an_eta(monkeypatch):
    clock = iter([100.0, 102.0, 104.0, 106.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    term = Terminal()
    with Progress(10, "train", unit="step", stream=term, use_tqdm=False) as bar:
        bar.update(1, loss=2.5)  # 1 step in 2 s: 9 left take 18 s
        bar.update(1, loss=2.0)  # 2 steps in 4 s: 8 left take 16 s
    frames = term.text.split("\r")[1:]
    assert all(f.rstrip("\n").endswith("\x1b[K") for f in frames)
    assert "ETA 0:18" in frames[0] and "loss=2.5" in frames[0]
    assert "ETA 0:16" in frames[1] and "2/10" in frames[1]


def test_log_lines_show_an_eta_too():
    import io

    log = io.StringIO()
    bar = Progress(4, "run", stream=log, every=2, use_tqdm=False)
    bar.update(2)
    assert re.search(r"run \[#+-+\] 2/4 .* it/s ETA \d+:\d\d", log.getvalue())


def test_tqdm_draws_the_bar_when_installed():
    pytest.importorskip("tqdm")
    term = Terminal()
    with Progress(5, "train", unit="step", stream=term) as bar:
        for _ in range(5):
            bar.update(1, loss=1.25)
    assert "100%|" in term.text and "5/5" in term.text and "loss=1.25" in term.text


def test_trainer_fit_calls_back_each_step_and_stops_when_told(monkeypatch):
    from tests.train.test_trainer import make

    t, reference = make(steps=6), make(steps=6)
    seen = []

    def callback(trainer, loss):
        seen.append((trainer.step, loss))
        return trainer.step < 4  # False after step 4 stops the run

    losses = t.fit(callback=callback)
    assert [s for s, _ in seen] == [1, 2, 3, 4] and t.step == 4
    np.testing.assert_allclose(losses, [reference.train_step() for _ in range(4)], rtol=1e-6)
    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    assert len(t.fit(progress=True)) == 2 and t.step == 6
    assert "2/2" in term.text and "loss=" in term.text
