"""CSRPattern: compact column spaces, relabelling and their caches."""

from __future__ import annotations

import gc

import torch

from gp_couple.sparse_pattern import CSRPattern

from .operators.mixins import random_pattern


def test_compact_keeps_only_touched_columns_and_is_cached():
    pattern = random_pattern(6, 30, density=0.3, seed=1, untouched=12)
    compact, touched = pattern.compact()
    torch.testing.assert_close(touched, torch.unique(pattern.columns))
    assert compact.num_columns == touched.numel() < pattern.num_columns
    torch.testing.assert_close(compact.row_pointer, pattern.row_pointer)
    torch.testing.assert_close(touched[compact.columns], pattern.columns)
    assert pattern.compact()[0] is compact
    # Relabelling is monotone: the transposed values are gathered by the same permutation.
    torch.testing.assert_close(compact.transpose()[1], pattern.transpose()[1])


def test_compact_of_a_pattern_touching_every_column_is_itself():
    pattern = CSRPattern(torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1]), 3)
    assert pattern.compact()[0] is pattern


def test_joint_compact_is_the_union_and_cached_per_partner():
    left = random_pattern(4, 25, density=0.3, seed=2, untouched=10)
    right = random_pattern(5, 25, density=0.3, seed=3, untouched=10)
    left_c, right_c, union = left.joint_compact(right)
    expected = torch.unique(torch.cat((left.columns, right.columns)))
    torch.testing.assert_close(union, expected)
    assert left_c.num_columns == right_c.num_columns == union.numel()
    torch.testing.assert_close(union[left_c.columns], left.columns)
    torch.testing.assert_close(union[right_c.columns], right.columns)
    assert left.joint_compact(right)[0] is left_c
    assert left.joint_compact(left)[0] is left.compact()[0]
    # The cache holds its partner weakly: a new pattern at a reused id() is not confused with it.
    del right, right_c
    gc.collect()
    other = random_pattern(5, 25, density=0.3, seed=4)
    torch.testing.assert_close(left.joint_compact(other)[2], torch.unique(torch.cat((left.columns, other.columns))))


def test_restrict_columns_keeps_exactly_the_entries_in_the_space():
    pattern = random_pattern(6, 20, density=0.4, seed=11)
    space = torch.tensor([1, 4, 5, 9, 13, 19])
    restricted, slots = pattern.restrict_columns(space)
    assert restricted.shape == (6, space.numel())
    keep = torch.isin(pattern.columns, space)
    torch.testing.assert_close(slots, keep.nonzero().squeeze(-1))
    torch.testing.assert_close(space[restricted.columns], pattern.columns[slots])
    torch.testing.assert_close(restricted.row_indices, pattern.row_indices[slots])
    empty, none = pattern.restrict_columns(torch.zeros(0, dtype=torch.int64))
    assert empty.shape == (6, 0) and empty.nnz == 0 and none.numel() == 0


def test_joint_restricted_is_the_intersection_and_cached_per_partner():
    left = random_pattern(5, 30, density=0.2, seed=12, untouched=8)
    right = random_pattern(7, 30, density=0.2, seed=13, untouched=8)
    (left_r, left_slots), (right_r, right_slots) = left.joint_restricted(right)
    shared = sorted(set(left.columns.tolist()) & set(right.columns.tolist()))
    assert left_r.num_columns == right_r.num_columns == len(shared)
    # Every shared column is touched by both restricted sides, so both are compact.
    assert left_r.touched_columns().tolist() == list(range(len(shared)))
    assert right_r.touched_columns().tolist() == list(range(len(shared)))
    assert torch.isin(left.columns[left_slots], torch.tensor(shared)).all()
    assert left.joint_restricted(right)[0][0] is left_r
    disjoint = CSRPattern(torch.tensor([0, 1]), torch.tensor([29]), 30)
    other = CSRPattern(torch.tensor([0, 1]), torch.tensor([0]), 30)
    (a, _), (b, _) = disjoint.joint_restricted(other)
    assert a.nnz == b.nnz == 0 and a.num_columns == 0


def test_derived_results_are_built_once_per_key():
    pattern = CSRPattern(torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1]), 3)
    calls = []
    first = pattern.derived("test:list", lambda: calls.append(1) or [len(calls)])
    assert pattern.derived("test:list", lambda: calls.append(1) or [len(calls)]) is first
    assert calls == [1]
