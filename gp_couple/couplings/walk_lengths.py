r"""Walk-length couplings for graph random features (paper, Section 4 "Graph random features"
[sec:grfs]).

A walk-length coupling draws the lengths of the ``m`` walkers that leave each start
node. Whatever the joint distribution, each walker's length must stay geometric,

.. math::

    \Pr(l = k) = (1 - p_\mathrm{halt})^k \, p_\mathrm{halt}, \qquad k = 0, 1, \dots,

(the number of moves before the walker halts), because the importance weights of the
features assume it. Any coupling with these marginals gives unbiased kernel
estimates; a good coupling gives lower variance.

The interface is one method, :meth:`WalkLengthCoupling.sample_lengths`. Paired
couplings group the ``m`` walkers of a node into ``m / 2`` pairs ``(0, 1), (2, 3),
...`` that are coupled within and independent across pairs; they subclass
:class:`PairedWalkLengthCoupling` and implement :meth:`~PairedWalkLengthCoupling.sample_pairs`.

Writing your own coupling
-------------------------
A coupling that mirrors the quantile of the first walker of each pair
(:math:`u_2 = 1 - u_1`, which makes one walk long when the other is short)::

    import numpy as np
    from gp_couple.couplings import PairedWalkLengthCoupling, geometric_quantile

    class QuantileMirror(PairedWalkLengthCoupling):
        name = "quantile-mirror"

        def sample_pairs(self, num_pairs, p_halt, rng):
            u1 = rng.random(num_pairs)
            return geometric_quantile(u1, p_halt), geometric_quantile(1.0 - u1, p_halt)

Setting ``name`` registers the class in :data:`WALK_LENGTH_COUPLINGS` (see
:mod:`gp_couple.registry`), so it plugs in anywhere a built-in coupling does, by
instance or by name, e.g.
``GRFKernel(graph, num_walkers=16, p_halt=0.4, coupling="quantile-mirror")``, and a
kernel using it saves and reloads into a freshly built kernel. A coupling with
parameters returns them from :meth:`~gp_couple.registry.Registered.params` (the
keyword arguments of its constructor) so that ``to_dict`` / ``from_dict`` round-trip.
Because ``1 - u_1`` is uniform, each length is geometric and the estimates stay
unbiased; ``tests/couplings/test_walk_lengths.py`` shows how to check both properties.
What a coupling returns is checked (:func:`checked_lengths`): the wrong number of
lengths, or lengths that are fractional, NaN or negative, raise a ``ValueError`` naming
the class and the method instead of being truncated or reshaped silently.
"""

from __future__ import annotations

import json
import math
import warnings
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .._checks import check_int, check_p_halt
from .._counter_random import geometric_lengths
from .._files import write_text_atomically
from .._random import SeedLike, as_numpy_generator, draw_seed
from ..registry import Registered, Registry, check_description_fields, check_json_value, json_type_name

__all__ = [
    "WALK_LENGTH_COUPLINGS",
    "WalkLengthCoupling",
    "PairedWalkLengthCoupling",
    "IIDWalkLengthCoupling",
    "AntitheticWalkLengthCoupling",
    "SigmaCoupling",
    "geometric_quantile",
    "check_p_halt",
    "coupling_from_dict",
    "get_walk_length_coupling",
    "checked_lengths",
]


def geometric_quantile(u: np.ndarray | float, p_halt: float) -> np.ndarray:
    r"""Inverse CDF of the walk length, :math:`F^{-1}(u) = \inf\{k : F(k) \ge u\}`.

    With :math:`F(k) = 1 - (1 - p)^{k + 1}` this is
    :math:`\lceil \log(1 - u) / \log(1 - p) \rceil - 1`, which equals
    :math:`\lfloor \log(1 - u) / \log(1 - p) \rfloor` except on a null set.

    :param u: Uniforms in ``[0, 1)``.
    :param p_halt: Termination probability.
    :return: Integer lengths (int64), same shape as ``u``.
    """
    return _geometric_quantile(u, check_p_halt(p_halt))


def _geometric_quantile(u: np.ndarray | float, p_halt: float) -> np.ndarray:
    """:func:`geometric_quantile` for a ``p_halt`` already checked."""
    u_arr = np.asarray(u, dtype=np.float64)
    ratio = np.log1p(-u_arr) / math.log1p(-p_halt)
    # Floating-point guard: keep F(k) >= u exactly at bin boundaries.
    lengths = np.floor(ratio)
    return np.maximum(lengths, 0).astype(np.int64)


def checked_lengths(values: Any, coupling: WalkLengthCoupling, method: str, shape: tuple[int, ...],
                    what: str = "") -> np.ndarray:
    """What a coupling's ``method`` returned, as int64 walk lengths of ``shape``.

    The edge between the sampler and a user's coupling: a wrong count, fractional,
    non-finite or negative lengths are errors rather than silently truncated or
    reshaped.

    :param values: The returned lengths (array-like).
    :param coupling: The coupling (named in messages).
    :param method: The method that returned them (``"sample_lengths"``, ``"sample_pairs"``).
    :param shape: The expected shape; another shape with as many entries is reshaped.
    :param what: Says what the entries are, for messages (e.g. ``"one per pair"``).
    :return: A new int64 array of ``shape``.
    :raises ValueError: Naming the coupling class, the method and what was expected.
    """
    where = f"{type(coupling).__name__}.{method}"
    expected = f"{math.prod(shape)} non-negative integer lengths{f' ({what})' if what else ''}"
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where} returned {type(values).__name__}, which is not an array; expected "
                         f"{expected}") from error
    if array.dtype == np.bool_ or not (np.issubdtype(array.dtype, np.integer)
                                       or np.issubdtype(array.dtype, np.floating)):
        raise ValueError(f"{where} returned lengths of dtype {array.dtype}; expected {expected}")
    if array.size != math.prod(shape) or (len(shape) > 1 and array.shape != shape):
        raise ValueError(f"{where} returned {array.size} lengths (shape {array.shape}); expected {expected}, "
                         f"shape {shape}")
    if np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{where} returned NaN or infinite lengths; expected {expected}")
        fractional = array != np.floor(array)
        if np.any(fractional):
            raise ValueError(f"{where} returned non-integer lengths (e.g. {float(array[fractional].flat[0]):g}); "
                             f"expected {expected}")
    if array.size and array.min() < 0:
        raise ValueError(f"{where} returned a negative length ({array.min():g}); expected {expected}")
    return array.astype(np.int64).reshape(shape)


#: Registry of walk-length couplings: every subclass with a ``name`` joins it.
WALK_LENGTH_COUPLINGS: Registry[WalkLengthCoupling] = Registry("walk-length coupling")


class WalkLengthCoupling(Registered, ABC, registry=WALK_LENGTH_COUPLINGS):
    """Interface: draw the walk lengths of ``num_walkers`` walkers from each of ``num_starts`` nodes.

    Subclasses must keep every walker's marginal length geometric (see the module
    docstring) and may correlate the walkers of the same start node. Walkers of
    different start nodes must be independent. A subclass that sets ``name`` is
    registered in :data:`WALK_LENGTH_COUPLINGS`.
    """

    #: Short name used in reports, JSON and the command line.
    name: ClassVar[str] = "coupling"

    @abstractmethod
    def sample_lengths(self, num_starts: int, num_walkers: int, p_halt: float,
                       seed: SeedLike = None) -> np.ndarray:
        """Draw lengths.

        :param num_starts: Number of start nodes :math:`R`.
        :param num_walkers: Walkers per node :math:`m`.
        :param p_halt: Termination probability.
        :param seed: Seed or generator.
        :return: int64 array of shape ``(num_starts, num_walkers)``.
        """

    def sample_rows(self, rows: np.ndarray, num_starts: int, num_walkers: int, p_halt: float,
                    rng: np.random.Generator) -> np.ndarray:
        """Rows ``rows`` of ``sample_lengths(num_starts, num_walkers, p_halt, rng)``: the same lengths.

        The walk sampler draws a block of start nodes at a time and keeps the rows of the
        nodes it walks from (:func:`gp_couple.features.walks.sample_walk_lengths`), so a
        node's lengths do not depend on which other nodes are sampled. This default draws
        the whole block and checks it (:func:`checked_lengths`); the built-in couplings draw
        only the rows asked for, which is what makes walks from start nodes scattered over a
        large graph cheap.

        :param rows: Distinct rows in ``[0, num_starts)``, in increasing order.
        :param num_starts: Rows of the whole draw.
        :param num_walkers: Walkers per node :math:`m`.
        :param p_halt: Termination probability (checked).
        :param rng: The generator of the whole draw; left as the whole draw leaves it.
        :return: int64 array of shape ``(rows.size, num_walkers)``.
        """
        drawn = checked_lengths(self.sample_lengths(num_starts, num_walkers, p_halt, rng), self, "sample_lengths",
                                (num_starts, num_walkers), "one per start node and walker")
        return drawn[rows]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.params() == other.params()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), json.dumps(self.params(), sort_keys=True)))


class IIDWalkLengthCoupling(WalkLengthCoupling):
    """Independent geometric walk lengths (the standard GRF estimator)."""

    name = "iid"

    def sample_lengths(self, num_starts: int, num_walkers: int, p_halt: float,
                       seed: SeedLike = None) -> np.ndarray:
        num_starts = check_int("num_starts", num_starts, 0)
        num_walkers = check_int("num_walkers", num_walkers)
        p = check_p_halt(p_halt)
        # Compiled inverse-CDF draws from counter-based streams: several times faster
        # than numpy's geometric sampler, which dominated small feature builds.
        return geometric_lengths(draw_seed(seed), p, (num_starts, num_walkers))

    def sample_rows(self, rows: np.ndarray, num_starts: int, num_walkers: int, p_halt: float,
                    rng: np.random.Generator) -> np.ndarray:
        if type(self).sample_lengths is not IIDWalkLengthCoupling.sample_lengths:  # a subclass draws its own way
            return super().sample_rows(rows, num_starts, num_walkers, p_halt, rng)
        # Counter-based streams: a row is drawn alone from the same seed.
        return geometric_lengths(draw_seed(rng), p_halt, (num_starts, num_walkers), rows)


class PairedWalkLengthCoupling(WalkLengthCoupling):
    """Base class for couplings of walker pairs ``(0, 1), (2, 3), ...`` of each node.

    Requires an even number of walkers; pairs are independent of each other.
    """

    @abstractmethod
    def sample_pairs(self, num_pairs: int, p_halt: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``num_pairs`` independent coupled pairs of geometric lengths.

        Called by :meth:`sample_lengths`, which has checked the arguments: implementations
        trust them.

        :param num_pairs: Number of pairs.
        :param p_halt: Termination probability, a float in ``(0, 1)``.
        :param rng: The generator to draw from.
        :return: Two int64 arrays of shape ``(num_pairs,)``.
        """

    def sample_lengths(self, num_starts: int, num_walkers: int, p_halt: float,
                       seed: SeedLike = None) -> np.ndarray:
        num_starts = check_int("num_starts", num_starts, 0)
        num_walkers = check_int("num_walkers", num_walkers)
        p = check_p_halt(p_halt)
        if num_walkers % 2:
            raise ValueError(
                f"the {self.name} coupling pairs walkers, so num_walkers must be even; "
                f"got {num_walkers}")
        rng = as_numpy_generator(seed)
        num_pairs = num_starts * (num_walkers // 2)
        pairs = self.sample_pairs(num_pairs, p, rng)
        if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__len__") or len(pairs) != 2:
            raise ValueError(f"{type(self).__name__}.sample_pairs must return two arrays (first, second) of "
                             f"{num_pairs} lengths each, got {type(pairs).__name__}")
        lengths = np.empty((num_starts, num_walkers), dtype=np.int64)
        for column, values in enumerate(pairs):
            lengths[:, column::2] = checked_lengths(values, self, "sample_pairs", (num_pairs,),
                                                    "one per pair").reshape(num_starts, -1)
        return lengths

    def sample_rows(self, rows: np.ndarray, num_starts: int, num_walkers: int, p_halt: float,
                    rng: np.random.Generator) -> np.ndarray:
        if (type(self).sample_pairs not in _ELEMENTWISE_PAIRS
                or type(self).sample_lengths is not PairedWalkLengthCoupling.sample_lengths
                or not hasattr(rng.bit_generator, "advance") or num_walkers % 2):
            return super().sample_rows(rows, num_starts, num_walkers, p_halt, rng)
        width = num_walkers // 2
        first, second = self.sample_pairs(num_starts * width, p_halt, _RowUniforms(rng, rows, width))
        lengths = np.empty((rows.size, num_walkers), dtype=np.int64)
        lengths[:, 0::2] = first.reshape(rows.size, width)
        lengths[:, 1::2] = second.reshape(rows.size, width)
        return lengths


class _RowUniforms:
    """Stands in for a generator in :meth:`PairedWalkLengthCoupling.sample_pairs`: ``random(size)`` returns
    the entries of ``rng.random(size)`` that belong to the given rows, ``width`` consecutive draws per row,
    and leaves ``rng`` where ``rng.random(size)`` would.

    Exact for bit generators with ``advance`` (numpy's default PCG64), where a float64 uniform
    is one 64-bit output: the draws between the rows are skipped, not made.
    """

    def __init__(self, rng: np.random.Generator, rows: np.ndarray, width: int) -> None:
        self._rng, self._width = rng, width
        # Runs of consecutive rows [first, stop), each drawn by one call (a full block is one run).
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        self._runs = [(int(run[0]), int(run[-1]) + 1) for run in np.split(rows, breaks) if run.size]
        self._count = rows.size

    def random(self, size: int) -> np.ndarray:
        bit_generator, width = self._rng.bit_generator, self._width
        parts, position = [], 0
        for first, stop in self._runs:
            bit_generator.advance(first * width - position)
            parts.append(self._rng.random((stop - first) * width))
            position = stop * width
        bit_generator.advance(size - position)
        return np.concatenate(parts) if parts else np.empty(self._count * width)


class AntitheticWalkLengthCoupling(PairedWalkLengthCoupling):
    r"""Antithetic termination (Reid et al. 2023; paper, Appendix C.2 "Antithetic termination"
    [app:antithetic_term]).

    At every step the two walkers of a pair share a uniform :math:`t`: walker 1 halts
    if :math:`t < p`, walker 2 if :math:`(t + 1/2) \bmod 1 < p`; once one has halted,
    the other goes on with the same numbers, i.e. independently.

    The joint law of the two lengths is sampled exactly without stepping: per step,
    both continue with probability :math:`c = \max(0, 1 - 2p)`, both halt with
    :math:`b = \max(0, 2p - 1)`, and exactly one halts (each equally likely)
    otherwise. So the step :math:`T` of the first halting event is
    :math:`\mathrm{Geom}_0(1 - c)`, and a survivor's length is
    :math:`T + 1 + \mathrm{Geom}_0(p)`.
    """

    name = "antithetic"

    def sample_pairs(self, num_pairs: int, p_halt: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        p = p_halt  # checked by sample_lengths
        both_continue = max(0.0, 1.0 - 2.0 * p)
        both_halt = max(0.0, 2.0 * p - 1.0)
        first_event = _geometric_quantile(rng.random(num_pairs), 1.0 - both_continue) if both_continue > 0.0 else None
        event = rng.random(num_pairs) * (1.0 - both_continue)
        if first_event is None:
            first_event = np.zeros(event.shape, dtype=np.int64)
        halt_together = event < both_halt
        first_halts = ~halt_together & (event < both_halt + (1.0 - both_continue - both_halt) / 2.0)
        survivor = first_event + 1 + _geometric_quantile(rng.random(num_pairs), p)
        first = np.where(halt_together | first_halts, first_event, survivor)
        second = np.where(halt_together | ~first_halts, first_event, survivor)
        return first, second


class SigmaCoupling(PairedWalkLengthCoupling):
    r""":math:`\sigma`-coupled walk lengths (paper, Definition 4.2, Section 4.1
    [def:coupled_grfs_def]).

    The pair's quantiles follow the permutation density
    :math:`p_\sigma(x, y) = n\,\mathbb 1[\sigma(\lceil n x\rceil) = \lceil n y\rceil]`:
    draw :math:`u_1 \sim U(0, 1)`, let :math:`q = \lceil n u_1 \rceil`, draw :math:`u_2`
    uniformly inside bin :math:`\sigma(q)`, and push both through the geometric inverse
    CDF. Both marginals stay uniform, so both lengths stay geometric.

    Fit :math:`\sigma` with :func:`gp_couple.couplings.fit_sigma_coupling` (the linear
    matching of eq. (56), the tractable matching problem, Appendix C.3
    [eq:tractable_ot_formulation]) or
    :func:`gp_couple.couplings.fit_pagerank_sigma_coupling` (eq. (82), the PageRank matching
    problem, Appendix E.2 [eq:matching_pagerank]).

    :param permutation: :math:`\sigma` as a 0-based permutation of ``range(n)``:
        bin ``q`` is matched with bin ``permutation[q]``.
    :param p_halt: The termination probability it was fitted for (``None`` if
        unknown). Sampling at another ``p_halt`` stays unbiased but warns, because the
        matching is then not the optimised one.
    :param metadata: Free-form JSON-serialisable provenance (fit graph, kernel, ...).
    """

    name = "sigma"

    def __init__(self, permutation: Any, p_halt: float | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        perm = np.asarray(permutation)
        if perm.ndim != 1 or perm.size == 0:
            raise ValueError("permutation must be a non-empty 1-D sequence")
        if perm.dtype == np.bool_ or not (np.issubdtype(perm.dtype, np.integer)
                                          or np.issubdtype(perm.dtype, np.floating)):
            raise TypeError(f"permutation must hold integers, got dtype {perm.dtype}")
        if not np.issubdtype(perm.dtype, np.integer):
            if not np.all(np.equal(np.mod(perm, 1), 0)):
                raise TypeError("permutation must hold integers")
            perm = perm.astype(np.int64)
        if not np.array_equal(np.sort(perm), np.arange(perm.size)):
            raise ValueError(
                f"permutation must be a permutation of 0..{perm.size - 1} (0-based)")
        self.permutation = perm.astype(np.int64)
        self.permutation.setflags(write=False)
        self.p_halt = None if p_halt is None else check_p_halt(p_halt)
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        # Checked without recursion: deeply nested metadata is a ValueError, not a RecursionError.
        check_json_value(metadata, "metadata")
        self.metadata = dict(metadata or {})

    @property
    def order(self) -> int:
        """Permutation order :math:`n` (number of quantile bins)."""
        return int(self.permutation.size)

    @classmethod
    def identity(cls, order: int, p_halt: float | None = None) -> SigmaCoupling:
        """The identity permutation: both walkers get lengths from the same bin."""
        return cls(np.arange(check_int("order", order)), p_halt)

    def sample_pairs(self, num_pairs: int, p_halt: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        p = p_halt  # checked by sample_lengths
        if self.p_halt is not None and not math.isclose(p, self.p_halt, rel_tol=1e-9):
            warnings.warn(
                f"this sigma-coupling was fitted for p_halt={self.p_halt} but is used with "
                f"p_halt={p}; estimates stay unbiased but the variance reduction is not the "
                "optimised one", stacklevel=3)
        n = self.order
        u1 = rng.random(num_pairs)
        bins = np.minimum((u1 * n).astype(np.int64), n - 1)
        u2 = (self.permutation[bins] + rng.random(num_pairs)) / n
        return _geometric_quantile(u1, p), _geometric_quantile(np.minimum(u2, np.nextafter(1.0, 0.0)), p)

    def params(self) -> dict[str, Any]:
        return {"order": self.order, "permutation": self.permutation.tolist(),
                "p_halt": self.p_halt, "metadata": self.metadata}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SigmaCoupling:
        """Rebuild from :meth:`to_dict` output, validated against its schema.

        The schema (what :meth:`save` writes): a JSON object with ``"type": "sigma"``, a
        non-empty ``"permutation"`` list of integers forming a permutation of
        ``0..n-1``, and optionally ``"order"`` (an integer equal to ``n``),
        ``"p_halt"`` (``null`` or a number in ``(0, 1)``) and ``"metadata"`` (``null`` or
        an object). Other fields are errors, so that a misspelt field is not ignored.

        :param data: The description.
        :raises TypeError: If ``data`` is not a dict or a field has the wrong JSON type
            (e.g. a ``type`` that is not a string, or booleans, floats, strings or
            ``null`` in ``permutation``); the message names the field.
        :raises ValueError: For a wrong ``type``, a missing ``permutation``, an unknown
            field, an ``order`` that disagrees with the permutation, a bad value, or
            nesting deeper than :data:`gp_couple.registry.MAX_JSON_DEPTH` levels.
        """
        if not isinstance(data, dict):
            raise TypeError(f"a sigma-coupling description must be a JSON object (dict), got "
                            f"{type(data).__name__}")
        if "type" not in data:
            raise ValueError("not a sigma-coupling description: it has no 'type' field")
        if not isinstance(data["type"], str):
            raise TypeError(f"sigma-coupling field 'type' must be the string {cls.name!r}, got "
                            f"{json_type_name(data['type'])} {data['type']!r}")
        if data["type"] != cls.name:
            raise ValueError(f"not a sigma-coupling description: type={data['type']!r}")
        check_description_fields(data, _SIGMA_FIELDS, "sigma-coupling")
        check_json_value(data, "the sigma-coupling description", types_only_json=False)
        if "permutation" not in data:
            raise ValueError("sigma-coupling description has no 'permutation'")
        permutation = data["permutation"]
        if not isinstance(permutation, list) or not permutation:
            raise TypeError(f"sigma-coupling field 'permutation' must be a non-empty list of integers, "
                            f"got {json_type_name(permutation)}")
        for position, entry in enumerate(permutation):
            if isinstance(entry, bool) or not isinstance(entry, int):
                raise TypeError(f"sigma-coupling field 'permutation' must hold integers, got "
                                f"{json_type_name(entry)} {entry!r} at position {position}")
        order = data.get("order")
        if order is not None:
            if isinstance(order, bool) or not isinstance(order, int):
                raise TypeError(f"sigma-coupling field 'order' must be an integer, got {json_type_name(order)}")
            if order != len(permutation):
                raise ValueError(f"sigma-coupling field 'order' is {order} but 'permutation' has "
                                 f"{len(permutation)} entries")
        p_halt = data.get("p_halt")
        if p_halt is not None and (isinstance(p_halt, bool) or not isinstance(p_halt, (int, float))):
            raise TypeError(f"sigma-coupling field 'p_halt' must be null or a number, got "
                            f"{json_type_name(p_halt)}")
        metadata = data.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"sigma-coupling field 'metadata' must be null or an object, got "
                            f"{json_type_name(metadata)}")
        try:
            return cls(permutation, p_halt, metadata)
        except ValueError as error:
            raise ValueError(f"sigma-coupling description: {error}") from error

    def save(self, path: str | Path) -> None:
        """Write the fitted permutation and its provenance as JSON (UTF-8).

        The file is replaced in one step (:func:`gp_couple._files.atomic_write`): a
        failed write leaves a previous file at ``path`` as it was.
        """
        write_text_atomically(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> SigmaCoupling:
        """Read a coupling written by :meth:`save`.

        :param path: A UTF-8 JSON file (see :meth:`from_dict` for its schema).
        :raises FileNotFoundError: If there is no file at ``path``.
        :raises ValueError: If the file is not UTF-8 text, not JSON, nested too deeply or
            not a valid description; the message names the file.
        :raises TypeError: If a field has the wrong type; the message names the file.
        """
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"no sigma-coupling file at {file}")
        try:
            # JSON files are UTF-8 (RFC 8259); a UTF-8 byte-order mark is tolerated.
            text = file.read_bytes().decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise ValueError(f"{file} is not UTF-8 text (sigma-coupling files are UTF-8 JSON; "
                             f"{error.reason} at byte {error.start})") from None
        if "\x00" in text:
            raise ValueError(f"{file} is not UTF-8 text: it holds NUL characters (UTF-16 or UTF-32?); "
                             "sigma-coupling files are UTF-8 JSON")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{file} is not valid JSON: {error}") from error
        except RecursionError:
            raise ValueError(f"{file} is nested too deeply to be a sigma-coupling description") from None
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{file}: {error}") from error

    def __repr__(self) -> str:
        return f"SigmaCoupling(order={self.order}, p_halt={self.p_halt})"


#: Fields of a sigma-coupling description (see :meth:`SigmaCoupling.from_dict`).
_SIGMA_FIELDS = frozenset({"type", "order", "permutation", "p_halt", "metadata"})


#: The ``sample_pairs`` that only draw ``rng.random(num_pairs)`` arrays and map them to lengths
#: entry by entry, so that a row's pairs can be drawn alone (:class:`_RowUniforms`). A subclass
#: that draws its pairs another way falls back to the whole draw.
_ELEMENTWISE_PAIRS = frozenset({AntitheticWalkLengthCoupling.sample_pairs, SigmaCoupling.sample_pairs})


def get_walk_length_coupling(coupling: str | WalkLengthCoupling) -> WalkLengthCoupling:
    """Resolve a registered name (``"iid"``, ``"antithetic"``, a user's) or an instance to an instance.

    :param coupling: A name in :data:`WALK_LENGTH_COUPLINGS` whose class needs no
        arguments, or a :class:`WalkLengthCoupling` (returned as is).
    :raises ValueError: For an unknown name, listing the known ones, or a coupling that
        needs parameters (a fitted σ-coupling).
    :raises TypeError: For anything else.
    """
    if isinstance(coupling, str) and coupling == SigmaCoupling.name:
        raise ValueError(
            "a sigma-coupling needs a fitted permutation: build it with "
            "fit_sigma_coupling(...) or SigmaCoupling.load(path)")
    return WALK_LENGTH_COUPLINGS.resolve(coupling, WalkLengthCoupling, "coupling")


def coupling_from_dict(data: dict[str, Any]) -> WalkLengthCoupling:
    """Inverse of :meth:`WalkLengthCoupling.to_dict` for every registered coupling."""
    return WALK_LENGTH_COUPLINGS.from_dict(data)
