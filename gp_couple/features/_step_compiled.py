r"""The compiled loops (numba) of the step matrix's products :math:`\mathbf S f` and :math:`\mathbf S^\top\mathbf g`.

The feature values are :math:`\mathrm{vec}(\Phi) = \mathbf S f`: each slot sums its
entries' weights times the modulation at their steps, in the order stored, so a slot's
value does not depend on the other slots computed with it. Their gradient with respect to
the modulation sums each entry's weight times the gradient of its slot into the entry's
step: one pass over the entries, without a transposed matrix, which would hold as many
numbers as the features themselves. Both loops read the features' own index arrays, in
whatever integer type they are stored. The transposed product cuts the slots into a fixed
number of chunks, each summed on its own and then in order, so neither result depends on
the number of threads. The step matrix of some slots is gathered from the features' arrays
by one more loop, without an index array per entry.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

#: Chunks of slots summed separately (fixed: the sums' order does not follow the thread count).
STEP_CHUNKS = 64


@njit(parallel=True, cache=True)
def step_product(slot_pointer, steps, weights, modulation, out):  # pragma: no cover - compiled
    r"""``out[b, u] = sum(weights[e] * modulation[b, steps[e]] for the entries e of slot u)``.

    :param slot_pointer: Entry range of every slot (``(U + 1,)``).
    :param steps: Step of every entry (``(E,)``).
    :param weights: Weight of every entry (``(E,)``).
    :param modulation: ``(B, T)`` in the weights' dtype.
    :param out: Zeroed output, ``(B, U)``.
    """
    batch = modulation.shape[0]
    for slot in prange(slot_pointer.size - 1):
        for entry in range(slot_pointer[slot], slot_pointer[slot + 1]):
            for row in range(batch):
                out[row, slot] += weights[entry] * modulation[row, steps[entry]]


@njit(parallel=True, cache=True)
def step_transpose_product(slot_pointer, steps, weights, grad, out):  # pragma: no cover - compiled
    r"""``out[b, t] = sum(weights[e] * grad[b, slot(e)] for entries e at step t)``.

    :param slot_pointer: Entry range of every slot (``(U + 1,)``).
    :param steps: Step of every entry (``(E,)``).
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


@njit(parallel=True, cache=True)
def gather_slots(slot_pointer, steps, weights, slots, pointer, out_steps, out_weights):  # pragma: no cover
    """Copy the entries of ``slots`` (in order) into ``out_steps`` and ``out_weights`` at ``pointer``.

    :param slot_pointer: Entry range of every slot of the features (``(U + 1,)``).
    :param steps: Step of every entry (``(E,)``).
    :param weights: Weight of every entry (``(E,)``).
    :param slots: The slots to gather (``(V,)``).
    :param pointer: Entry range of every gathered slot (``(V + 1,)``).
    :param out_steps: Output steps, ``(pointer[-1],)`` in the dtype of ``steps``.
    :param out_weights: Output weights, ``(pointer[-1],)`` in the dtype of ``weights``.
    """
    for index in prange(slots.size):
        first = slot_pointer[slots[index]]
        offset = pointer[index] - first
        for entry in range(first, slot_pointer[slots[index] + 1]):
            out_steps[entry + offset] = steps[entry]
            out_weights[entry + offset] = weights[entry]
