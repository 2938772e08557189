r"""The compiled loop (numba) of the step matrix's transposed product :math:`\mathbf S^\top\mathbf g`.

The gradient of the feature values :math:`\mathrm{vec}(\Phi) = \mathbf S f` with respect to
the modulation :math:`f` sums each stored entry's weight times the gradient of its slot into
the entry's step. One pass over the entries, without the transposed matrix: that matrix
would hold as many numbers as the features themselves. The slots are cut into a fixed
number of chunks, each summed on its own and then in order, so the result does not depend
on the number of threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

#: Chunks of slots summed separately (fixed: the sums' order does not follow the thread count).
STEP_CHUNKS = 64


@njit(parallel=True, cache=True)
def step_transpose_product(slot_pointer, steps, weights, grad, out):  # pragma: no cover - compiled
    r"""``out[b, t] = sum(weights[e] * grad[b, slot(e)] for entries e at step t)``.

    :param slot_pointer: Entry range of every slot (int64, ``(U + 1,)``).
    :param steps: Step of every entry (int64, ``(E,)``).
    :param weights: Weight of every entry (``(E,)``).
    :param grad: Gradient of the slots' values, ``(B, U)`` in the weights' dtype.
    :param out: Zeroed output, ``(B, T)``.
    """
    batch, num_terms = out.shape
    slots = slot_pointer.size - 1
    chunks = min(STEP_CHUNKS, max(slots, 1))
    partial = np.zeros((chunks, batch, num_terms), dtype=out.dtype)
    for chunk in prange(chunks):
        for slot in range(chunk * slots // chunks, (chunk + 1) * slots // chunks):
            for entry in range(slot_pointer[slot], slot_pointer[slot + 1]):
                for row in range(batch):
                    partial[chunk, row, steps[entry]] += weights[entry] * grad[row, slot]
    for chunk in range(chunks):
        out += partial[chunk]
