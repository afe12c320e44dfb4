"""The shared dependency loop: random DAGs on random worker counts, errors, freeing."""

import signal
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from einsummable.engines.scheduler import run
from einsummable.errors import EngineError
from einsummable.ir.priority import PROGRAM, ranks


@st.composite
def dags(draw):
    n = draw(st.integers(1, 40))
    inputs = [tuple(sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3))))) if i else ()
              for i in range(n)]
    workers = draw(st.integers(1, 8))
    location = [draw(st.integers(0, 11)) for _ in range(n)]
    return inputs, workers, location


def oracle(inputs):
    vals = []
    for i, ins in enumerate(inputs):
        vals.append(i + sum(vals[j] for j in ins))
    return vals


@given(dags())
def test_every_dag_on_every_worker_count_matches_sequential(dag):
    inputs, workers, location = dag
    got = run(inputs, lambda i, args: i + sum(args), location=location, workers=workers,
              keep=set(range(len(inputs))))
    assert [got[i] for i in range(len(inputs))] == oracle(inputs)


@given(dags(), st.integers(1, 6))
def test_in_the_program_order_no_task_starts_past_the_window_and_every_run_ends(dag, window):
    """ir/priority.py's window: a task starts only within ``window`` ids of the earliest
    unfinished one (the memory estimate's order), and the run never stalls."""
    inputs, workers, location = dag
    n = len(inputs)
    lock, done, started = threading.Lock(), [False] * n, []

    def execute(i, args):
        with lock:
            low = next((t for t in range(n) if not done[t]), n)
            started.append((i, low))
        time.sleep(0.0005 * (i % 3))
        with lock:
            done[i] = True
        return i + sum(args)

    got = run(inputs, execute, location=location, workers=workers, keep=set(range(n)),
              rank=ranks(inputs, [1.0] * n, PROGRAM), window=window)
    assert [got[i] for i in range(n)] == oracle(inputs)
    assert all(i < low + window for i, low in started)


@pytest.mark.parametrize("workers", [1, 2])
def test_blocks_are_freed_after_their_last_reader(workers):
    live = set()
    peak = [0]
    lock = threading.Lock()

    class Block:
        def __init__(self, i):
            self.i = i
            with lock:
                live.add(i)
                peak[0] = max(peak[0], len(live))

        def __del__(self):
            with lock:
                live.discard(self.i)

    chain = [()] + [(i,) for i in range(199)]
    out = run(chain, lambda i, args: Block(i), location=[0] * 200, workers=workers, keep={199})
    assert out[199].i == 199
    assert peak[0] <= 4


def test_a_failing_task_stops_the_run_and_is_named():
    started = []

    def execute(i, args):
        started.append(i)
        if i == 3:
            raise ValueError("boom")
        time.sleep(0.001)
        return i

    inputs = [()] * 4 + [(k,) for k in range(4, 200)]
    inputs[4] = (3,)
    with pytest.raises(EngineError, match=r"task 3 \(node three\).*boom"):
        run(inputs, execute, location=[k % 2 for k in range(200)], workers=2, keep={199},
            describe=lambda i: "node three" if i == 3 else str(i))
    assert 199 not in started
    assert not [t for t in threading.enumerate() if t.name.startswith("einsummable-")]


def test_ranks_orders_the_long_chain_first():
    inputs = [(), (), (1,), (2,)]
    rank = ranks(inputs, [1, 1, 1, 1])
    assert rank == [1, 3, 2, 1]


@pytest.mark.parametrize("engine", ["reference", "sequential"])
def test_the_oracles_name_the_node_or_task_that_failed(engine, monkeypatch):
    """The oracles run through the shared loop, so a failing kernel is an EngineError naming its step."""
    import numpy as np

    import einsummable as es
    from einsummable.engines.kernels import reference as reference_kernel

    def broken(op, arrays, variables=None):
        raise FloatingPointError("boom")

    monkeypatch.setattr(reference_kernel, "einsum", broken)
    g = es.Graph()
    x = g.input("x", (3, 4))
    g.output("y", es.nn.relu(x))
    with pytest.raises(EngineError, match=r"\(.*relu.*\) failed: FloatingPointError: boom"):
        es.compile(g, engine=engine).run({"x": np.ones((3, 4), np.float32)})


def _workers_alive():
    return [t for t in threading.enumerate() if t.name.startswith("einsummable-") and t.is_alive()]


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler, which a process started in the background of a shell
    without job control lacks (SIGINT ignored from birth: it never sees Ctrl-C there)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


ctrl_c = pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")


@ctrl_c
@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_stops_the_workers_within_one_kernel():
    """KeyboardInterrupt in the caller (as Ctrl-C delivers it) stops the run: no task starts
    after it, and the workers are gone when the exception reaches the caller."""
    main = threading.main_thread().ident
    kernel = 0.05
    started, interrupted = [], []

    def execute(i, args):
        started.append((i, time.perf_counter()))
        if i == 6:
            interrupted.append(time.perf_counter())
            signal.pthread_kill(main, signal.SIGINT)  # what Ctrl-C sends
        time.sleep(kernel)
        return i

    inputs = [()] * 2 + [(k - 2,) for k in range(2, 200)]  # two chains, one per worker
    with pytest.raises(KeyboardInterrupt):
        run(inputs, execute, location=[k % 2 for k in range(200)], workers=2, keep={199})
    raised = time.perf_counter()
    assert not _workers_alive()
    assert raised - interrupted[0] < 2 * kernel + 0.1
    late = [i for i, t in started if t > interrupted[0] + 0.01]
    assert len(late) <= 1, late  # at most the other worker's task already under way


def test_a_keyboard_interrupt_inside_a_task_stays_a_keyboard_interrupt():
    def execute(i, args):
        if i == 5:
            raise KeyboardInterrupt
        return i

    with pytest.raises(KeyboardInterrupt):
        run([()] + [(k,) for k in range(49)], execute, location=[k % 2 for k in range(50)], workers=2,
            keep={49})
    assert not _workers_alive()


@ctrl_c
@pytest.mark.usefixtures("sigint_raises")
def test_ctrl_c_during_a_compiled_program_leaves_no_worker_running(monkeypatch):
    import numpy as np

    import einsummable as es
    from einsummable.engines.kernels import fast as kernels

    kernel, calls, interrupted = 0.02, [], []
    main = threading.main_thread().ident
    prepare = kernels.prepare

    def slow(op):  # every kernel takes 20 ms; the 10th sends Ctrl-C
        run_op = prepare(op)

        def timed(args, variables):
            calls.append(time.perf_counter())
            if len(calls) == 10:
                interrupted.append(time.perf_counter())
                signal.pthread_kill(main, signal.SIGINT)
            time.sleep(kernel)
            return run_op(args, variables)

        return timed

    monkeypatch.setattr(kernels, "prepare", slow)
    g = es.Graph()
    x = g.input("x", (64, 64))
    h = x
    for _ in range(60):
        h = es.nn.relu(h @ x) * (1 / 64)
    g.output("h", h)
    prog = es.compile(g, workers=2)
    X = np.random.default_rng(0).standard_normal((64, 64), dtype=np.float32)
    with pytest.raises(KeyboardInterrupt):
        prog.run({"x": X})
    assert not _workers_alive()
    assert time.perf_counter() - interrupted[0] < 2 * kernel + 0.1
    assert len([t for t in calls if t > interrupted[0] + 0.005]) <= 1
