"""nemo_topr/data/parallel_tokenization.py's workers. What they tokenize, drop and refuse, against
one process: tests/data/test_prepared.py."""

import multiprocessing
import signal

from nemo_topr.data import parallel_tokenization


def test_a_worker_ends_on_sigterm_whatever_handler_its_parent_had():
    """The pool ends its workers with SIGTERM while it holds their task queue's lock
    (multiprocessing's Pool.terminate, which leaving the pool's `with` calls). A SIGTERM handler
    forked from the parent (a run's stop handler) would let a worker wait on for that lock, and
    the preparation for the worker, for ever."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # handled, and the process goes on
    try:
        pool = multiprocessing.get_context("fork").Pool(1, initializer=parallel_tokenization._start_worker,
                                                        initargs=(None, None, ()))
        disposition = pool.apply(signal.getsignal, (signal.SIGTERM,))
        pool.close()  # the workers end on the pool's sentinel: this test cannot hang as the bug did
        pool.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert disposition == signal.SIG_DFL
