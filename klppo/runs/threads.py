"""The thread counts a run computes with, set inside the process and restored on exit.

A matrix product split over more BLAS threads adds its partial sums in another order, so the
same seed gives other floats. An environment variable such as ``OPENBLAS_NUM_THREADS`` acts only
if it is set before numpy is imported, which a notebook, a test or a user's script cannot
promise; :func:`compute_threads` sets the pools of the libraries already loaded (numpy's BLAS,
through threadpoolctl) and torch's intra-op pool, whatever was imported before, and puts both
back when the run ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from threadpoolctl import threadpool_info, threadpool_limits

__all__ = ["BLAS_THREADS", "compute_threads"]

#: numpy's BLAS computes the fast path's small products: fastest and exact on one thread.
BLAS_THREADS = 1


def _blas_record() -> list[dict[str, Any]]:
    return [{"library": i["internal_api"], "num_threads": i["num_threads"],
             "version": i.get("version")}
            for i in threadpool_info() if i["user_api"] == "blas"]


@contextlib.contextmanager
def compute_threads(torch_threads: int, blas_threads: int = BLAS_THREADS
                    ) -> Iterator[dict[str, Any]]:
    """Compute on ``torch_threads`` torch threads and ``blas_threads`` BLAS threads inside the
    block; yields the record of what was set (for ``metadata.json``)."""
    import numpy  # noqa: F401 - load numpy's BLAS so that its pool is found and limited

    before = torch.get_num_threads()
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        torch.set_num_threads(torch_threads)
        try:
            yield {"torch": torch.get_num_threads(), "blas": _blas_record()}
        finally:
            torch.set_num_threads(before)
