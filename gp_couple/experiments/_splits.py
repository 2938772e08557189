"""Random train/test splits of a regression dataset, standardisation and per-split random streams."""

from __future__ import annotations

import zlib

import numpy as np

from .._checks import check_positive_int
from .._random import SeedLike, as_numpy_generator

__all__ = ["random_split", "standardise", "split_stream"]


def random_split(num_points: int, max_train: int, max_test: int,
                 seed: SeedLike = None) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint random train/test indices: a shuffled 50/50 split, each half capped.

    :param num_points: Dataset size (at least 2).
    :param max_train: Most training points.
    :param max_test: Most test points.
    :param seed: Seed or generator.
    :return: Sorted train and test indices.
    :raises ValueError: For fewer than 2 points or non-positive caps.
    """
    num_points = check_positive_int("num_points", num_points)
    if num_points < 2:
        raise ValueError("a train/test split needs at least 2 points")
    max_train = check_positive_int("max_train", max_train)
    max_test = check_positive_int("max_test", max_test)
    order = as_numpy_generator(seed).permutation(num_points)
    half = num_points // 2
    train = order[:min(half, max_train)]
    test = order[half:half + min(num_points - half, max_test)]
    return np.sort(train), np.sort(test)


def standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centre and scale both arrays with the training mean and standard deviation (per column).

    Columns constant on the training set are only centred.
    """
    mean = train.mean(axis=0)
    scale = train.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    return (train - mean) / scale, (test - mean) / scale


def split_stream(seed: int, split: int, *labels: str) -> np.random.Generator:
    """A random stream for one (split, labels...) cell of an experiment.

    Streams are keyed by the labels' CRC32, so adding or reordering couplings on the
    command line does not change any other coupling's draws.
    """
    words = [seed, split, *(zlib.crc32(label.encode()) for label in labels)]
    return np.random.default_rng(np.random.SeedSequence(words))
