"""The walk sampler's compiled loops (numba).

Randomness is counter-based: walker ``k`` of start node ``v`` draws its neighbour
choices from a SplitMix64 stream keyed by ``(seed, v * m + k)`` (independent directions),
or the walkers of ``v`` on node ``u`` at step ``t`` share one draw keyed by
``(stream_start(seed, v), t * N + u)`` (repelling directions). Results therefore do
not depend on the number of threads, on the order in which rows are processed, or on
which other start nodes are sampled in the same call.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

# threads_for and SERIAL_WORK_LIMIT are re-exported: the sampler's callers use compiled.threads_for.
from .._counter_random import SERIAL_WORK_LIMIT, next_unit, stream_start, threads_for  # noqa: F401

#: Rows up to this degree are searched by a linear count rather than by bisection.
_LINEAR_SEARCH_LIMIT = 16
#: Multiplier of the Fibonacci hash that groups repelling walkers by node.
_HASH = np.uint64(0x9E3779B97F4A7C15)


@njit(inline="always", cache=True)
def _choose_edge(indptr, cumulative, choice_degrees, node, u):  # pragma: no cover - compiled
    """The edge a walker on ``node`` takes for the uniform ``u`` (the proposal's inverse CDF).

    Uniform rows (``choice_degrees > 0``) take ``indptr[node] + floor(u * deg)``;
    other rows take the first edge whose cumulative probability exceeds ``u``.
    """
    base = indptr[node]
    degree = choice_degrees[node]
    if degree > 0:
        return base + np.int64(u * degree)
    # The first edge whose cumulative probability exceeds u is base + #{cumulative <= u}
    # (the row's last value is exactly 1 > u). Counting over a short contiguous row beats
    # a search whose comparisons are random (mispredicted half the time); rows that are
    # not uniform have at least two edges, and most have few, so those are unrolled.
    width = -degree
    count = np.int64(cumulative[base] <= u)
    if width <= 4:
        if width > 2:
            count += cumulative[base + 1] <= u
            if width > 3:
                count += cumulative[base + 2] <= u
        return base + count
    if width <= _LINEAR_SEARCH_LIMIT:
        for edge in range(base + 1, base + width - 1):
            count += cumulative[edge] <= u
        return base + count
    # Branch-free lower bound: the answer stays in [base, base + width). The row's last
    # cumulative value is exactly 1 > u.
    while width > 1:
        half = width >> 1
        base += half * np.int64(cumulative[base + half - 1] <= u)
        width -= half
    return base


@njit(inline="always", cache=True)
def _edge_ratio(indptr, indices, ratios, node_scales, node, edge):  # pragma: no cover - compiled
    """The importance ratio of ``edge`` out of ``node``: the table's, or on unit weights
    :math:`(d_u^{-1/2} d_v^{-1/2}) \\deg(u)` from the per-node scales (the table's value, bit for bit)."""
    if ratios.size:
        return ratios[edge]
    return (node_scales[node] * node_scales[indices[edge]]) * np.float64(indptr[node + 1] - indptr[node])


@njit(inline="always", cache=True)
def _write_row_walks(indptr, indices, ratios, node_scales, cumulative, choice_degrees, start, row_lengths, seed_u,
                     inv_keep, inv_walkers, columns, steps, weights, position):  # pragma: no cover - compiled
    """Write one row's entries from ``position``; return the position after them.

    The row gets a step-0 entry ``(start, 0, 1)`` followed by one entry per move of each
    walker, ``(visited node, step, load / m)``, where the load is the product of the
    proposal's importance ``ratios`` times ``inv_keep = 1 / (1 - p_halt)`` per move.
    """
    columns[position] = start
    steps[position] = 0
    weights[position] = 1.0
    position += 1
    num_walkers = row_lengths.size
    base = np.uint64(start) * np.uint64(num_walkers)
    for k in range(num_walkers):
        length = row_lengths[k]
        if length == 0:
            continue
        state = stream_start(seed_u, base + np.uint64(k))
        current = start
        load = inv_walkers
        for t in range(1, length + 1):
            state, u = next_unit(state)
            edge = _choose_edge(indptr, cumulative, choice_degrees, current, u)
            load *= _edge_ratio(indptr, indices, ratios, node_scales, current, edge) * inv_keep
            current = indices[edge]
            columns[position] = current
            steps[position] = t
            weights[position] = load
            position += 1
    return position


@njit(inline="always", cache=True)
def _reversed_bits(value, bits):  # pragma: no cover - compiled
    """The lowest ``bits`` bits of ``value`` (below 2**32) in reverse order (five swaps, no loop)."""
    value = ((value >> 1) & 0x55555555) | ((value & 0x55555555) << 1)
    value = ((value >> 2) & 0x33333333) | ((value & 0x33333333) << 2)
    value = ((value >> 4) & 0x0F0F0F0F) | ((value & 0x0F0F0F0F) << 4)
    value = ((value >> 8) & 0x00FF00FF) | ((value & 0x00FF00FF) << 8)
    value = ((value >> 16) & 0xFFFF) | ((value & 0xFFFF) << 16)
    return value >> (32 - bits)


@njit(inline="always", cache=True)
def _next_spread_slot(counter, bits, size):  # pragma: no cover - compiled
    """Next slot of the bit-reversal permutation of ``0..size-1`` and the advanced counter.

    The counter runs over ``0..2**bits - 1``; its ``bits``-bit reversal is the slot, and
    reversals ``>= size`` are skipped (at most half of the values, so two steps on
    average). The slots taken in order are a permutation of ``0..size-1`` (so the group's
    points ``frac(U + slot/size)`` stay one stratified set) in which every prefix of
    length ``2**b`` is spread evenly (van der Corput order).
    """
    while True:
        reversed_value = _reversed_bits(counter, bits)
        counter += 1
        if reversed_value < size:
            return reversed_value, counter


def pool_size() -> int:
    """The size of numba's thread pool, read at run time: the compiled entry points take it as ``pool``.

    ``numba.get_thread_id()`` lies in ``[0, pool)`` whatever ``numba.set_num_threads`` masks;
    read inside compiled code, ``numba.config.NUMBA_NUM_THREADS`` would be frozen into the
    cached machine code, wrong for a process started with another ``NUMBA_NUM_THREADS``.
    """
    return int(numba.config.NUMBA_NUM_THREADS)


@njit(cache=True)
def _repelling_scratch(num_walkers, threads):  # pragma: no cover - compiled
    """Per-thread scratch of :func:`_repelling_row`: walker state, group state and a small hash table.

    The table (node -> group) has at least twice as many slots as walkers, so probes stay short.
    ``threads`` is the size of numba's thread pool (:func:`pool_size`), which bounds every
    ``numba.get_thread_id()``.
    """
    table = 2
    while table < 2 * num_walkers:
        table *= 2
    walkers = np.empty((threads, 9, num_walkers), dtype=np.int64)
    table_node = np.full((threads, table), -1, dtype=np.int64)
    return (walkers, np.empty((threads, num_walkers), dtype=np.float64),
            np.empty((threads, num_walkers), dtype=np.float64),
            np.empty((threads, num_walkers), dtype=np.float64), table_node,
            np.empty((threads, table), dtype=np.int64))


@njit(cache=True)
def _repelling_row(indptr, indices, ratios, node_scales, cumulative, choice_degrees, start, row_lengths, seed_u,
                   inv_keep, inv_walkers, columns, steps, weights, position, write_entries, walkers,
                   load, group_uniform, group_spacing, table_node, table_group):  # pragma: no cover - compiled
    """:func:`_write_row_walks` with repelling directions (walkers advance in lock-step).

    At step ``t`` the active walkers on node ``v`` form a group of size ``k``; the group
    draws one uniform ``U`` from the stream keyed by ``(start, t, v)`` and its ``j``-th
    walker (walkers ordered by decreasing length) moves with ``frac(U + s_k(j) / k)``,
    where :func:`_next_spread_slot` enumerates ``s_k``, a permutation of ``0..k-1`` whose prefixes
    are spread over the circle. Consecutive ranks must not get consecutive slots: the
    longest walkers, which carry the long-range terms of the features, would then take
    the same neighbour at every node they share and move as one block, so the variance
    of those terms would stop falling with the number of walkers.
    Entries land where :func:`_write_row_walks` puts them (each walker's moves
    contiguous, walkers in order). With ``write_entries`` false nothing is written and
    ``walkers[4]`` ends as the endpoints, by walker. ``table_node`` must be all -1 on entry
    (it is left so). The walkers' state (node, load, next entry) is kept in ``order``'s order,
    so the loops over the active walkers (a prefix of it) read it contiguously.
    """
    current, cursor, order, group, by_walker, group_size, used, group_bits, group_counter = (
        walkers[0], walkers[1], walkers[2], walkers[3], walkers[4], walkers[5], walkers[6],
        walkers[7], walkers[8])
    num_walkers = row_lengths.size
    num_nodes = np.uint64(choice_degrees.size)
    if write_entries:
        columns[position] = start
        steps[position] = 0
        weights[position] = 1.0
        position += 1
    longest = 0
    for k in range(num_walkers):
        by_walker[k] = position
        position += row_lengths[k]
        longest = max(longest, row_lengths[k])
    # Walkers by decreasing length, equal lengths in walker order (a stable counting
    # sort: O(m + longest)): the walkers still moving at step t are the prefix order[:active].
    first = np.zeros(longest + 2, dtype=np.int64)
    for k in range(num_walkers):
        first[longest - row_lengths[k] + 1] += 1
    for length in range(1, longest + 2):
        first[length] += first[length - 1]
    for k in range(num_walkers):
        bucket = longest - row_lengths[k]
        order[first[bucket]] = k
        first[bucket] += 1
    for i in range(num_walkers):
        current[i] = start
        load[i] = inv_walkers
        cursor[i] = by_walker[order[i]]
    row_key = stream_start(seed_u, np.uint64(start))
    mask = table_node.size - 1
    active = num_walkers
    t = 0
    while True:
        t += 1
        while active > 0 and row_lengths[order[active - 1]] < t:
            active -= 1
        if active == 0:
            break
        groups = 0
        for i in range(active):
            node = current[i]
            slot = np.int64((np.uint64(node) * _HASH) >> np.uint64(40)) & mask
            while True:
                stored = table_node[slot]
                if stored == node:
                    g = table_group[slot]
                    break
                if stored == -1:
                    table_node[slot] = node
                    table_group[slot] = groups
                    used[groups] = slot
                    group_size[groups] = 0
                    # One draw per group: the first draw of stream (t * N + node) of the row's key,
                    # keyed like stream_start but with a single mix (this runs once per group).
                    _, uniform = next_unit(row_key ^ ((np.uint64(t) * num_nodes + np.uint64(node)) * _HASH))
                    group_uniform[groups] = uniform
                    g = groups
                    groups += 1
                    break
                slot = (slot + 1) & mask
            group[i] = g
            group_size[g] += 1
        for g in range(groups):
            table_node[used[g]] = -1
            size = group_size[g]
            group_spacing[g] = 1.0 / size
            bits = 0
            while (1 << bits) < size:
                bits += 1
            group_bits[g] = bits
            group_counter[g] = 0
        # Walkers reach their group's slots in rank order, so one counter per group
        # enumerates s_k(0), s_k(1), ... (see _next_spread_slot).
        for i in range(active):
            g = group[i]
            slot, group_counter[g] = _next_spread_slot(group_counter[g], group_bits[g], group_size[g])
            u = group_uniform[g] + slot * group_spacing[g]
            u -= np.float64(u >= 1.0)  # frac(U + j/k); a branch here would be mispredicted often
            node = current[i]
            edge = _choose_edge(indptr, cumulative, choice_degrees, node, u)
            # frac(U + j/k) can round to just below 1, where u * deg may round up to deg.
            edge = min(edge, indptr[node + 1] - 1)
            load[i] *= _edge_ratio(indptr, indices, ratios, node_scales, node, edge) * inv_keep
            current[i] = indices[edge]
            if write_entries:
                columns[cursor[i]] = current[i]
                steps[cursor[i]] = t
                weights[cursor[i]] = load[i]
                cursor[i] += 1
    if not write_entries:
        for i in range(num_walkers):
            by_walker[order[i]] = current[i]
    return position


@njit(inline="always", cache=True)
def _walk_row(indptr, indices, ratios, node_scales, cumulative, choice_degrees, start, row_lengths, seed_u,
              inv_keep, inv_walkers, columns, steps, weights, position, repelling,
              scratch):  # pragma: no cover - compiled
    if repelling:
        thread = numba.get_thread_id()
        return _repelling_row(indptr, indices, ratios, node_scales, cumulative, choice_degrees, start, row_lengths,
                              seed_u, inv_keep, inv_walkers, columns, steps, weights, position, True,
                              scratch[0][thread], scratch[1][thread], scratch[2][thread],
                              scratch[3][thread], scratch[4][thread], scratch[5][thread])
    return _write_row_walks(indptr, indices, ratios, node_scales, cumulative, choice_degrees, start, row_lengths,
                            seed_u, inv_keep, inv_walkers, columns, steps, weights, position)


@njit(parallel=True, cache=True)
def walk_rows(indptr, indices, ratios, node_scales, cumulative, choice_degrees, starts, lengths, seed, inv_keep,
              inv_walkers, repelling, out_indptr, out_columns, out_steps,
              out_weights, pool):  # pragma: no cover - compiled
    """Fill one CSR row of per-step entries per start node (see :func:`_write_row_walks`).

    ``lengths`` must already be zero for start nodes without neighbours.
    """
    seed_u = np.uint64(seed)
    scratch = _repelling_scratch(lengths.shape[1] if repelling else 0, pool)
    for r in prange(lengths.shape[0]):
        _walk_row(indptr, indices, ratios, node_scales, cumulative, choice_degrees, starts[r], lengths[r], seed_u,
                  inv_keep, inv_walkers, out_columns, out_steps, out_weights, out_indptr[r], repelling,
                  scratch)


@njit(parallel=True, cache=True)
def walk_endpoints(indptr, indices, ratios, node_scales, cumulative, choice_degrees, starts, lengths, seed, repelling,
                   out_endpoints, pool):  # pragma: no cover - compiled
    """Endpoint of each walk (same random streams and moves as :func:`walk_rows`)."""
    num_rows, num_walkers = lengths.shape
    seed_u = np.uint64(seed)
    scratch = _repelling_scratch(num_walkers if repelling else 0, pool)
    no_columns = np.empty(0, dtype=indices.dtype)
    no_steps = np.empty(0, dtype=np.uint16)
    no_weights = np.empty(0, dtype=np.float64)
    for r in prange(num_rows):
        start = starts[r]
        if repelling:
            thread = numba.get_thread_id()
            _repelling_row(indptr, indices, ratios, node_scales, cumulative, choice_degrees, start, lengths[r],
                           seed_u, 1.0, 1.0, no_columns, no_steps, no_weights, np.int64(0), False,
                           scratch[0][thread], scratch[1][thread], scratch[2][thread],
                           scratch[3][thread], scratch[4][thread], scratch[5][thread])
            for k in range(num_walkers):
                out_endpoints[r, k] = scratch[0][thread, 4, k]
            continue
        base = np.uint64(start) * np.uint64(num_walkers)
        for k in range(num_walkers):
            length = lengths[r, k]
            current = start
            if length > 0:
                state = stream_start(seed_u, base + np.uint64(k))
                for _ in range(length):
                    state, u = next_unit(state)
                    current = indices[_choose_edge(indptr, cumulative, choice_degrees, current, u)]
            out_endpoints[r, k] = current


@njit(parallel=True, cache=True)
def gather_ceiling(indptr, indices, degrees, starts, lengths, seed, out_sink):  # pragma: no cover
    """Benchmark ceiling: the same random neighbour gathers with no bookkeeping."""
    num_rows, num_walkers = lengths.shape
    seed_u = np.uint64(seed)
    for r in prange(num_rows):
        start = starts[r]
        acc = 0
        base = np.uint64(start) * np.uint64(num_walkers)
        for k in range(num_walkers):
            state = stream_start(seed_u, base + np.uint64(k))
            current = start
            for _ in range(lengths[r, k]):
                state, u = next_unit(state)
                current = indices[indptr[current] + np.int64(u * degrees[current])]
            acc += current
        out_sink[r] = acc


#: Most distinct (column, step) pairs :func:`_coalesce_hashed` merges in one row (their
#: index is packed in 16 bits). Every row tries the hash table first, however many raw
#: entries it has (walks revisit the same pairs); only rows with more distinct pairs are sorted.
_PACKED_ROW_LIMIT = 1 << 16
#: Rows up to this length are sorted by insertion (short walks, e.g. p_halt = 0.5).
_INSERTION_SORT_LIMIT = 32
#: The base-2 logarithm of the fewest slots of :func:`_coalesce_hashed`'s table in use (64; rows that reach it
#: have more than :data:`_INSERTION_SORT_LIMIT` entries, so the whole table has at least 128). A row starts
#: with at least an eighth of its raw entries (walks revisit the same pairs), and the table doubles while
#: more than half full.
_INITIAL_TABLE_BITS = 6
#: An empty slot of :func:`_coalesce_hashed`'s table (no (column, step) pair packs to it).
_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
#: Widest digit, in bits, of :func:`_radix_sort_pairs` (its count table has ``2**_RADIX_BITS`` slots).
_RADIX_BITS = 11


@njit(inline="always", cache=True)
def _insertion_sort(keys, n):  # pragma: no cover - compiled
    for i in range(1, n):
        key = keys[i]
        j = i - 1
        while j >= 0 and keys[j] > key:
            keys[j + 1] = keys[j]
            j -= 1
        keys[j + 1] = key


@njit(inline="always", cache=True)
def _merge_sorted(sorted_columns, sorted_steps, sorted_weights, n, columns, steps, weights,
                  lo):  # pragma: no cover - compiled
    """Write ``n`` entries sorted by (column, step) from ``lo``, summing equal pairs.

    Returns (merged entries, distinct columns).
    """
    out = lo
    distinct = 0
    previous_column = -1
    previous_step = -1
    for i in range(n):
        column = np.int64(sorted_columns[i])
        step = np.int64(sorted_steps[i])
        if column == previous_column and step == previous_step:
            weights[out - 1] += sorted_weights[i]
        else:
            columns[out] = column
            steps[out] = step
            weights[out] = sorted_weights[i]
            out += 1
            if column != previous_column:
                distinct += 1
            previous_column = column
            previous_step = step
    return out - lo, distinct


@njit(cache=True)
def _coalesce_row(columns, steps, weights, lo, hi, scratch):  # pragma: no cover - compiled
    """Sort entries ``lo:hi`` by (column, step), merge equal pairs, compact them to ``lo``.

    ``scratch`` is the calling thread's part of :func:`_thread_scratch`. Short rows are
    sorted by insertion; others are merged in a hash table keyed by (column, step) first,
    so only the distinct pairs are sorted, and rows with more distinct pairs than
    :data:`_PACKED_ROW_LIMIT` by a stable sort of all their entries. Equal pairs are summed
    in entry order either way. Returns (merged entries, distinct columns).
    """
    n = hi - lo
    if n == 0:
        return 0, 0
    keys, sums, used, table_keys, buffer, counts = scratch
    if n > _INSERTION_SORT_LIMIT:
        entries, distinct = _coalesce_hashed(columns, steps, weights, lo, n, keys, sums, used, table_keys, buffer,
                                             counts)
        if entries >= 0:
            return entries, distinct
        return _coalesce_long_row(columns, steps, weights, lo, hi)
    # One uint64 per entry: column (high 32 bits) | step (16) | local index (16). Sorting
    # the values in place needs no indirection and no allocation.
    row_keys = keys[:n]
    for i in range(n):
        row_keys[i] = ((np.uint64(columns[lo + i]) << np.uint64(32))
                       | (np.uint64(steps[lo + i]) << np.uint64(16)) | np.uint64(i))
    _insertion_sort(row_keys, n)
    sorted_steps = used
    for i in range(n):
        key = row_keys[i]
        sums[i] = weights[lo + np.int64(key & np.uint64(0xFFFF))]
        sorted_steps[i] = np.int64((key >> np.uint64(16)) & np.uint64(0xFFFF))
        row_keys[i] = key >> np.uint64(32)
    return _merge_sorted(row_keys, sorted_steps, sums, n, columns, steps, weights, lo)


@njit(cache=True)
def _rehash(table_keys, keys, used, distinct, mask, shift):  # pragma: no cover - compiled
    """Move the ``distinct`` keys of :func:`_coalesce_hashed`'s table into its first ``mask + 1`` slots."""
    for j in range(distinct):
        table_keys[used[j]] = _EMPTY
    for j in range(distinct):
        slot = np.int64(((keys[j] >> np.uint64(16)) * _HASH) >> shift)
        while table_keys[slot] != _EMPTY:
            slot = (slot + 1) & mask
        table_keys[slot] = keys[j]
        used[j] = slot


@njit(inline="always", cache=True)
def _coalesce_hashed(columns, steps, weights, lo, n, keys, sums, used, table_keys, buffer,
                     counts):  # pragma: no cover - compiled
    """:func:`_coalesce_row` for longer rows: sum equal (column, step) pairs in an open-addressing table.

    Each distinct pair is packed as column (32 bits) | step (16) | its index (16), the same
    key in ``keys`` (which are then sorted and written out) and in the table, so a lookup
    reads one word (node indices are below :math:`2^{32} - 1`,
    :data:`~gp_couple.features.walks.MAX_WALK_NODES`, so no pair packs to :data:`_EMPTY`).
    The table (``table_keys`` all :data:`_EMPTY` on entry, and left so) has at least twice
    as many slots as ``keys`` holds distinct pairs; the part in use (:func:`_rehash`)
    starts small enough to stay in cache and doubles while more than half full. Returns
    ``(-1, -1)``, with the row untouched, when it has more distinct pairs than ``keys`` holds.
    The distinct pairs are sorted by :func:`_radix_sort_pairs` (``buffer`` and ``counts`` its
    scratch), or by insertion when there are few.
    """
    # A power-of-two prefix of table_keys, at most half full: walks revisit few pairs.
    bits = _INITIAL_TABLE_BITS
    while (1 << bits) < table_keys.size and (8 << bits) < n:
        bits += 1
    size = 1 << bits
    mask = size - 1
    shift = np.uint64(64 - bits)
    distinct = 0
    for i in range(n):
        pair = (np.uint64(columns[lo + i]) << np.uint64(16)) | np.uint64(steps[lo + i])
        slot = np.int64((pair * _HASH) >> shift)
        while True:
            stored = table_keys[slot]
            if stored >> np.uint64(16) == pair:
                sums[np.int64(stored & np.uint64(0xFFFF))] += weights[lo + i]
                break
            if stored == _EMPTY:
                if distinct == keys.size:
                    for j in range(distinct):
                        table_keys[used[j]] = _EMPTY
                    return -1, -1
                if 2 * (distinct + 1) > size and size < table_keys.size:
                    size *= 2
                    mask = size - 1
                    shift -= np.uint64(1)
                    _rehash(table_keys, keys, used, distinct, mask, shift)
                    slot = np.int64((pair * _HASH) >> shift)
                    continue
                key = (pair << np.uint64(16)) | np.uint64(distinct)
                table_keys[slot] = key
                used[distinct] = slot
                keys[distinct] = key
                sums[distinct] = weights[lo + i]
                distinct += 1
                break
            slot = (slot + 1) & mask
    for j in range(distinct):
        table_keys[used[j]] = _EMPTY
    row_keys = keys[:distinct]
    if distinct <= _INSERTION_SORT_LIMIT:
        _insertion_sort(row_keys, distinct)
    else:
        _radix_sort_pairs(keys, buffer, counts, distinct)
    previous_column = -1
    columns_seen = 0
    for j in range(distinct):
        key = row_keys[j]
        column = np.int64(key >> np.uint64(32))
        columns[lo + j] = column
        steps[lo + j] = np.int64((key >> np.uint64(16)) & np.uint64(0xFFFF))
        weights[lo + j] = sums[np.int64(key & np.uint64(0xFFFF))]
        if column != previous_column:
            columns_seen += 1
            previous_column = column
    return distinct, columns_seen


@njit(inline="always", cache=True)
def _radix_sort_pairs(keys, buffer, counts, n):  # pragma: no cover - compiled
    """Sort the packed keys ``keys[:n]`` of :func:`_coalesce_hashed` (distinct pairs) by (column, step).

    A least-significant-digit radix sort of the compact rank :math:`(c - c_{\\min})(s_{\\max} + 1) + s`
    of each key's column ``c`` and step ``s``, so its passes cover only the row's span of columns
    and steps: two or three passes of at most :data:`_RADIX_BITS` bits over a few thousand keys,
    instead of a comparison sort whose branches on random keys are mispredicted half the time.
    Each pass is stable, so the order is exactly the pairs' order. ``buffer`` holds at least
    ``n`` keys and ``counts`` ``2**_RADIX_BITS`` counts; the sorted keys end in ``keys``.
    """
    low_column = np.uint64(0xFFFFFFFF)
    high_column = np.uint64(0)
    high_step = np.uint64(0)
    for j in range(n):
        key = keys[j]
        column = key >> np.uint64(32)
        step = (key >> np.uint64(16)) & np.uint64(0xFFFF)
        low_column = min(low_column, column)
        high_column = max(high_column, column)
        high_step = max(high_step, step)
    span = high_step + np.uint64(1)
    top = (high_column - low_column) * span + high_step
    bits = 1
    while (np.uint64(1) << np.uint64(bits)) <= top:
        bits += 1
    # Digits no wider than the keys are many (a count table larger than the keys costs more
    # than it saves), balanced over the fewest passes.
    width = 4
    while width < _RADIX_BITS and (1 << width) < n:
        width += 1
    passes = (bits + width - 1) // width
    width = (bits + passes - 1) // passes
    digit_mask = np.uint64((1 << width) - 1)
    source, target = keys, buffer
    for pass_index in range(passes):
        shift = np.uint64(pass_index * width)
        counts[:1 << width] = 0
        for j in range(n):
            key = source[j]
            rank = ((key >> np.uint64(32)) - low_column) * span + ((key >> np.uint64(16)) & np.uint64(0xFFFF))
            counts[np.int64((rank >> shift) & digit_mask)] += 1
        total = 0
        for digit in range(1 << width):
            count = counts[digit]
            counts[digit] = total
            total += count
        for j in range(n):
            key = source[j]
            rank = ((key >> np.uint64(32)) - low_column) * span + ((key >> np.uint64(16)) & np.uint64(0xFFFF))
            digit = np.int64((rank >> shift) & digit_mask)
            target[counts[digit]] = key
            counts[digit] += 1
        source, target = target, source
    if passes % 2 == 1:
        keys[:n] = buffer[:n]


@njit(cache=True)
def _coalesce_long_row(columns, steps, weights, lo, hi):  # pragma: no cover - compiled
    """:func:`_coalesce_row` for rows too long for packed keys (allocates)."""
    order = np.argsort(columns[lo:hi].astype(np.int64) * np.int64(1 << 16)
                       + steps[lo:hi].astype(np.int64), kind="mergesort")
    return _merge_sorted(columns[lo:hi][order], steps[lo:hi][order], weights[lo:hi][order],
                         hi - lo, columns, steps, weights, lo)


@njit(cache=True)
def _thread_scratch(indptr, threads):  # pragma: no cover - compiled
    """Per-thread scratch of :func:`_coalesce_row`: packed keys, sums, used slots, the hash table of packed keys,
    and the radix sort's second buffer of keys and its counts."""
    longest = 1
    for r in range(indptr.size - 1):
        longest = max(longest, min(indptr[r + 1] - indptr[r], _PACKED_ROW_LIMIT))
    table = 2
    while table < 2 * longest:
        table *= 2
    return (np.empty((threads, longest), dtype=np.uint64), np.empty((threads, longest), dtype=np.float64),
            np.empty((threads, longest), dtype=np.int64), np.full((threads, table), _EMPTY, dtype=np.uint64),
            np.empty((threads, longest), dtype=np.uint64), np.empty((threads, 1 << _RADIX_BITS), dtype=np.int64))


@njit(parallel=True, cache=True)
def coalesce_rows(indptr, columns, steps, weights, entry_counts, distinct_counts, pool):  # pragma: no cover
    """Coalesce every row of a raw decomposition in place (see :func:`_coalesce_row`)."""
    scratch = _thread_scratch(indptr, pool)
    for r in prange(indptr.size - 1):
        thread = numba.get_thread_id()
        entries, distinct = _coalesce_row(columns, steps, weights, indptr[r], indptr[r + 1],
                                          (scratch[0][thread], scratch[1][thread], scratch[2][thread],
                                           scratch[3][thread], scratch[4][thread], scratch[5][thread]))
        entry_counts[r] = entries
        distinct_counts[r] = distinct


@njit(parallel=True, cache=True)
def walk_and_coalesce_rows(indptr, indices, ratios, node_scales, cumulative, choice_degrees, starts, lengths, seed,
                           inv_keep, inv_walkers, repelling, raw_indptr, columns, steps, weights,
                           entry_counts, distinct_counts, pool):  # pragma: no cover - compiled
    """:func:`walk_rows` followed by :func:`_coalesce_row` on each row while it is in cache."""
    seed_u = np.uint64(seed)
    coalesce_scratch = _thread_scratch(raw_indptr, pool)
    scratch = _repelling_scratch(lengths.shape[1] if repelling else 0, pool)
    for r in prange(lengths.shape[0]):
        _walk_row(indptr, indices, ratios, node_scales, cumulative, choice_degrees, starts[r], lengths[r], seed_u,
                  inv_keep, inv_walkers, columns, steps, weights, raw_indptr[r], repelling, scratch)
        thread = numba.get_thread_id()
        entries, distinct = _coalesce_row(columns, steps, weights, raw_indptr[r], raw_indptr[r + 1],
                                          (coalesce_scratch[0][thread], coalesce_scratch[1][thread],
                                           coalesce_scratch[2][thread], coalesce_scratch[3][thread],
                                           coalesce_scratch[4][thread], coalesce_scratch[5][thread]))
        entry_counts[r] = entries
        distinct_counts[r] = distinct


@njit(parallel=True, cache=True)
def gather_coalesced(raw_indptr, raw_columns, raw_steps, raw_weights, entry_offsets, slot_offsets,
                     out_steps, out_weights, out_columns, out_slot_pointer):  # pragma: no cover
    """Copy coalesced rows (at the start of each raw row) into contiguous outputs.

    Fills the distinct columns of every row and, for every distinct (row, column) slot,
    the index of its first entry (``out_slot_pointer``).
    """
    for r in prange(raw_indptr.size - 1):
        source = raw_indptr[r]
        target = entry_offsets[r]
        count = entry_offsets[r + 1] - target
        slot = slot_offsets[r] - 1
        previous = -1
        for i in range(count):
            column = raw_columns[source + i]
            out_steps[target + i] = raw_steps[source + i]
            out_weights[target + i] = raw_weights[source + i]
            if column != previous:
                slot += 1
                previous = column
                out_columns[slot] = column
                out_slot_pointer[slot] = target + i


@njit(parallel=True, cache=True)
def feature_rows(row_pointer, columns, slot_pointer, steps, weights, modulation, rows, indptr, out_columns,
                  out_values):  # pragma: no cover - compiled
    """Rows ``rows`` of :math:`\\Phi = \\sum_t f(t)\\Phi_t` from the walk decomposition, into a CSR matrix whose
    ``indptr`` is given: each slot's value sums ``weights[e] * modulation[steps[e]]`` over its entries in order."""
    for r in prange(rows.size):
        first = row_pointer[rows[r]]
        target = indptr[r]
        for k in range(row_pointer[rows[r] + 1] - first):
            slot = first + k
            total = 0.0
            for e in range(slot_pointer[slot], slot_pointer[slot + 1]):
                total += weights[e] * modulation[steps[e]]
            out_columns[target + k] = columns[slot]
            out_values[target + k] = total
