"""Tests for walk-length couplings: geometric marginals, joint laws, serialisation, errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from gp_couple.couplings import (
    AntitheticWalkLengthCoupling,
    IIDWalkLengthCoupling,
    PairedWalkLengthCoupling,
    SigmaCoupling,
    WalkLengthCoupling,
    coupling_from_dict,
    geometric_quantile,
    get_walk_length_coupling,
)
from tests.stats import assert_geometric

P_HALTS = (0.1, 0.3, 0.5, 0.7)


class QuantileMirror(PairedWalkLengthCoupling):
    """The worked example of the module docstring: u2 = 1 - u1."""

    name = "quantile-mirror"

    def sample_pairs(self, num_pairs, p_halt, rng):
        u1 = rng.random(num_pairs)
        return geometric_quantile(u1, p_halt), geometric_quantile(1.0 - u1, p_halt)


def random_sigma(order: int = 20, seed: int = 3) -> SigmaCoupling:
    return SigmaCoupling(np.random.default_rng(seed).permutation(order))


COUPLINGS = [IIDWalkLengthCoupling(), AntitheticWalkLengthCoupling(), random_sigma(), SigmaCoupling.identity(7),
             QuantileMirror()]


class WalkLengthCouplingContract:
    """Reusable checks every walk-length coupling must pass (subclass and set ``coupling``)."""

    coupling: WalkLengthCoupling

    @pytest.mark.parametrize("p_halt", P_HALTS)
    def test_every_walker_is_geometric(self, p_halt: float) -> None:
        lengths = self.coupling.sample_lengths(20_000, 4, p_halt, seed=11)
        assert lengths.shape == (20_000, 4) and lengths.dtype == np.int64
        for walker in range(4):
            assert_geometric(lengths[:, walker], p_halt)

    def test_deterministic_under_seed(self) -> None:
        first = self.coupling.sample_lengths(50, 4, 0.3, seed=5)
        np.testing.assert_array_equal(first, self.coupling.sample_lengths(50, 4, 0.3, seed=5))
        assert not np.array_equal(first, self.coupling.sample_lengths(50, 4, 0.3, seed=6))

    @pytest.mark.parametrize("p_halt", (0.1, 0.7))
    def test_selected_rows_are_those_of_the_whole_draw(self, p_halt: float) -> None:
        # The sampler draws only the rows of the start nodes it walks from: the same lengths,
        # and the generator left where the whole draw leaves it.
        whole_rng, rows_rng = np.random.default_rng(8), np.random.default_rng(8)
        whole = self.coupling.sample_lengths(64, 6, p_halt, whole_rng)
        for rows in (np.array([0, 5, 6, 63]), np.array([17]), np.arange(64), np.array([], dtype=np.int64)):
            selected = self.coupling.sample_rows(rows, 64, 6, p_halt, np.random.default_rng(8))
            assert selected.shape == (rows.size, 6) and selected.dtype == np.int64
            np.testing.assert_array_equal(selected, whole[rows])
        self.coupling.sample_rows(np.array([3, 40]), 64, 6, p_halt, rows_rng)
        np.testing.assert_array_equal(rows_rng.random(4), whole_rng.random(4))

    def test_nodes_are_independent(self) -> None:
        lengths = self.coupling.sample_lengths(20_000, 2, 0.3, seed=2)
        # Walker 0 of node r against walker 0 of node r + 1.
        rho = stats.spearmanr(lengths[:-1:2, 0], lengths[1::2, 0]).statistic
        assert abs(rho) < 5 / math.sqrt(10_000)


@pytest.mark.parametrize("coupling", COUPLINGS, ids=lambda c: c.name)
class TestEveryCoupling(WalkLengthCouplingContract):
    @pytest.fixture(autouse=True)
    def _set(self, coupling: WalkLengthCoupling) -> None:
        self.coupling = coupling


class TestAntithetic:
    @staticmethod
    def stepwise_reference(num_pairs: int, p_halt: float, rng: np.random.Generator) -> np.ndarray:
        """The paper's description (app:antithetic_term): shared uniforms, one step at a time."""
        lengths = np.zeros((num_pairs, 2), dtype=np.int64)
        alive = np.ones((num_pairs, 2), dtype=bool)
        while alive.any():
            u = rng.random(num_pairs)
            halts = np.stack([u < p_halt, np.mod(u + 0.5, 1.0) < p_halt], axis=1)
            stop = alive & halts
            alive &= ~stop
            lengths += alive
        return lengths

    @pytest.mark.parametrize("p_halt", [0.2, 0.5, 0.8])
    def test_joint_law_matches_stepwise_simulation(self, p_halt: float) -> None:
        pairs = 40_000
        fast = AntitheticWalkLengthCoupling().sample_lengths(pairs, 2, p_halt, seed=1)
        slow = self.stepwise_reference(pairs, p_halt, np.random.default_rng(2))
        cap = 12
        table = np.zeros((2, (cap + 1) ** 2))
        for row, sample in enumerate((fast, slow)):
            keys = np.minimum(sample[:, 0], cap) * (cap + 1) + np.minimum(sample[:, 1], cap)
            table[row] = np.bincount(keys, minlength=(cap + 1) ** 2)
        table = table[:, table.sum(axis=0) >= 10]
        assert stats.chi2_contingency(table).pvalue > 1e-3

    def test_walkers_never_halt_together_below_one_half(self) -> None:
        lengths = AntitheticWalkLengthCoupling().sample_lengths(10_000, 2, 0.3, seed=0)
        assert np.all(lengths[:, 0] != lengths[:, 1])

    def test_lengths_are_negatively_correlated(self) -> None:
        lengths = AntitheticWalkLengthCoupling().sample_lengths(20_000, 2, 0.3, seed=0)
        rho = stats.pearsonr(lengths[:, 0], lengths[:, 1]).statistic
        assert rho < -5 / math.sqrt(20_000)


class TestSigma:
    def test_pairs_respect_the_permutation(self) -> None:
        order, p_halt = 8, 0.3
        coupling = random_sigma(order, seed=1)
        lengths = coupling.sample_lengths(5_000, 2, p_halt, seed=4)

        def bins(length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            # Quantile interval (F(l - 1), F(l)] of each length, in units of bins.
            low = (1 - (1 - p_halt) ** length) * order
            high = (1 - (1 - p_halt) ** (length + 1)) * order
            return np.floor(low).astype(int), np.minimum(np.ceil(high).astype(int) - 1, order - 1)

        low1, high1 = bins(lengths[:, 0])
        low2, high2 = bins(lengths[:, 1])
        for pair in range(len(lengths)):
            candidates = coupling.permutation[low1[pair]: high1[pair] + 1]
            assert np.any((candidates >= low2[pair]) & (candidates <= high2[pair]))

    def test_identity_gives_equal_bins_and_reversal_gives_anticorrelation(self) -> None:
        same = SigmaCoupling.identity(1000).sample_lengths(20_000, 2, 0.3, seed=0)
        assert np.mean(same[:, 0] == same[:, 1]) > 0.95
        reverse = SigmaCoupling(np.arange(30)[::-1]).sample_lengths(20_000, 2, 0.3, seed=0)
        assert stats.spearmanr(reverse[:, 0], reverse[:, 1]).statistic < -0.9

    def test_json_round_trip(self, tmp_path) -> None:
        coupling = SigmaCoupling([2, 0, 1], p_halt=0.4, metadata={"fit": "test"})
        path = tmp_path / "sigma.json"
        coupling.save(path)
        loaded = SigmaCoupling.load(path)
        assert loaded == coupling and loaded.p_halt == 0.4 and loaded.metadata == {"fit": "test"}
        assert coupling_from_dict(json.loads(path.read_text())) == coupling

    def test_warns_when_used_at_another_p_halt(self) -> None:
        coupling = SigmaCoupling([1, 0], p_halt=0.4)
        with pytest.warns(UserWarning, match="fitted for p_halt=0.4"):
            coupling.sample_lengths(3, 2, 0.1, seed=0)

    @pytest.mark.parametrize("permutation, error", [
        ([0, 0, 1], ValueError), ([1, 2, 3], ValueError), ([], ValueError),
        ([[0, 1]], ValueError), ([0.5, 1.5], TypeError)])
    def test_invalid_permutations(self, permutation, error) -> None:
        with pytest.raises(error):
            SigmaCoupling(permutation)

    def test_load_errors(self, tmp_path) -> None:
        with pytest.raises(FileNotFoundError):
            SigmaCoupling.load(tmp_path / "missing.json")
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        with pytest.raises(ValueError, match="not valid JSON"):
            SigmaCoupling.load(bad)
        bad.write_text(json.dumps({"type": "iid"}))
        with pytest.raises(ValueError, match="not a sigma-coupling"):
            SigmaCoupling.load(bad)


class TestErrorsAndRegistry:
    @pytest.mark.parametrize("coupling", [AntitheticWalkLengthCoupling(), random_sigma()], ids=lambda c: c.name)
    def test_paired_couplings_need_even_walkers(self, coupling) -> None:
        with pytest.raises(ValueError, match="even"):
            coupling.sample_lengths(3, 3, 0.5)

    @pytest.mark.parametrize("p_halt", [0.0, 1.0, -0.1, float("nan")])
    def test_invalid_p_halt(self, p_halt: float) -> None:
        with pytest.raises(ValueError, match="p_halt"):
            IIDWalkLengthCoupling().sample_lengths(2, 2, p_halt)

    def test_invalid_counts(self) -> None:
        with pytest.raises(ValueError, match="num_walkers"):
            IIDWalkLengthCoupling().sample_lengths(2, 0, 0.5)
        with pytest.raises(TypeError, match="num_walkers"):
            IIDWalkLengthCoupling().sample_lengths(2, 2.0, 0.5)
        with pytest.raises(TypeError, match="p_halt"):
            IIDWalkLengthCoupling().sample_lengths(2, 2, "0.5")

    def test_registry(self) -> None:
        assert isinstance(get_walk_length_coupling("iid"), IIDWalkLengthCoupling)
        assert isinstance(get_walk_length_coupling("antithetic"), AntitheticWalkLengthCoupling)
        with pytest.raises(ValueError, match="fitted permutation"):
            get_walk_length_coupling("sigma")
        with pytest.raises(ValueError, match="unknown"):
            get_walk_length_coupling("sobol")
        with pytest.raises(TypeError):
            get_walk_length_coupling(3)
        assert coupling_from_dict(AntitheticWalkLengthCoupling().to_dict()) == AntitheticWalkLengthCoupling()
        with pytest.raises(ValueError):
            coupling_from_dict({"type": "nope"})

    def test_geometric_quantile_inverts_the_cdf(self) -> None:
        p = 0.3
        cdf = 1 - (1 - p) ** (np.arange(10) + 1)
        # Just below F(k) maps to k, just above maps to k + 1.
        np.testing.assert_array_equal(geometric_quantile(cdf - 1e-9, p), np.arange(10))
        np.testing.assert_array_equal(geometric_quantile(cdf + 1e-9, p), np.arange(10) + 1)
        assert geometric_quantile(0.0, p) == 0


# ------------------------------------------------------------ sigma-coupling JSON schema
VALID_SIGMA = {"type": "sigma", "order": 3, "permutation": [2, 0, 1], "p_halt": 0.4, "metadata": {"fit": "x"}}
DROP = object()  # removes the field


@pytest.mark.parametrize("changes, error, message", [
    ({"order": 5}, ValueError, r"field 'order' is 5 but 'permutation' has 3 entries"),
    ({"order": "3"}, TypeError, r"field 'order' must be an integer, got string"),
    ({"order": True}, TypeError, r"field 'order' must be an integer, got boolean"),
    ({"permutation": [True, False]}, TypeError, r"field 'permutation' must hold integers, got boolean"),
    ({"permutation": [0.0, 2.0, 1.0], "order": DROP}, TypeError, r"'permutation' must hold integers, got float"),
    ({"permutation": ["0", "1"], "order": DROP}, TypeError, r"'permutation' must hold integers, got string"),
    ({"permutation": [0, None]}, TypeError, r"'permutation' must hold integers, got null"),
    ({"permutation": None}, TypeError, r"field 'permutation' must be a non-empty list of integers, got null"),
    ({"permutation": "201"}, TypeError, r"'permutation' must be a non-empty list .* got string"),
    ({"permutation": []}, TypeError, r"'permutation' must be a non-empty list"),
    ({"permutation": [[0, 1]]}, TypeError, r"'permutation' must hold integers, got list"),
    ({"permutation": [0, 0, 1]}, ValueError, r"permutation must be a permutation of 0\.\.2"),
    ({"metadata": "fit"}, TypeError, r"field 'metadata' must be null or an object, got string"),
    ({"metadata": [1]}, TypeError, r"field 'metadata' must be null or an object, got list"),
    ({"p_halt": "0.4"}, TypeError, r"field 'p_halt' must be null or a number, got string"),
    ({"p_halt": True}, TypeError, r"field 'p_halt'"),
    ({"p_halt": 1.5}, ValueError, r"p_halt must lie strictly between 0 and 1"),
    ({"permutaton": [0]}, ValueError, r"unknown field\(s\) \['permutaton'\]"),
    ({"type": "antithetic"}, ValueError, "not a sigma-coupling"),
])
def test_sigma_json_is_validated_against_its_schema(tmp_path, changes, error, message) -> None:
    data = {key: value for key, value in {**VALID_SIGMA, **changes}.items() if value is not DROP}
    with pytest.raises(error, match=message):
        SigmaCoupling.from_dict(data)
    path = tmp_path / "sigma.json"
    path.write_text(json.dumps(data))
    with pytest.raises(error, match=str(path)):  # load() names the file too
        SigmaCoupling.load(path)


def test_sigma_json_without_permutation_or_optional_fields() -> None:
    with pytest.raises(ValueError, match="no 'permutation'"):
        SigmaCoupling.from_dict({"type": "sigma"})
    minimal = SigmaCoupling.from_dict({"type": "sigma", "permutation": [1, 0]})
    assert minimal.order == 2 and minimal.p_halt is None and minimal.metadata == {}
    assert SigmaCoupling.from_dict(VALID_SIGMA).to_dict() == VALID_SIGMA


@pytest.mark.parametrize("document", [[1, 0], None, "sigma", 3])
def test_sigma_json_top_level_must_be_an_object(tmp_path, document) -> None:
    with pytest.raises(TypeError, match="must be a JSON object"):
        SigmaCoupling.from_dict(document)
    path = tmp_path / "sigma.json"
    path.write_text(json.dumps(document))
    with pytest.raises(TypeError, match="JSON object"):
        SigmaCoupling.load(path)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"permutation": [True, False]}, TypeError, "permutation must hold integers, got dtype bool"),
    ({"permutation": ["1", "0"]}, TypeError, "permutation must hold integers"),
    ({"permutation": [1, 0], "metadata": "fit"}, TypeError, "metadata must be a dict, got str"),
    ({"permutation": [1, 0], "metadata": {"graph": object()}}, TypeError, "metadata must be JSON-serialisable"),
])
def test_sigma_constructor_rejects_non_integer_permutations_and_bad_metadata(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        SigmaCoupling(**kwargs)


# ------------------------------------------------------------ hostile sigma-coupling files
def test_sigma_save_is_atomic(tmp_path, monkeypatch) -> None:
    path = tmp_path / "sigma.json"
    random_sigma(5).save(path)
    before = path.read_text()

    def failing_fsync(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    import gp_couple._files as files

    monkeypatch.setattr(files.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        random_sigma(7).save(path)
    assert path.read_text() == before and [entry.name for entry in tmp_path.iterdir()] == ["sigma.json"]
    assert SigmaCoupling.load(path) == random_sigma(5)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_sigma_file_in_another_encoding_names_the_file(tmp_path, encoding: str) -> None:
    path = tmp_path / "sigma.json"
    path.write_text(json.dumps(VALID_SIGMA), encoding=encoding)
    with pytest.raises(ValueError, match=f"{path} is not UTF-8 text"):
        SigmaCoupling.load(path)
    path.write_text(json.dumps(VALID_SIGMA), encoding="utf-8-sig")  # a UTF-8 byte-order mark is fine
    assert SigmaCoupling.load(path) == SigmaCoupling.from_dict(VALID_SIGMA)


def _nested(levels: int) -> dict:
    deep: dict = {}
    inner = deep
    for _ in range(levels):
        inner["a"] = {}
        inner = inner["a"]
    return deep


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  json.dumps({**VALID_SIGMA, "metadata": None})[:-1] + ', "x": '
                                  + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}",
                                  json.dumps({**VALID_SIGMA, "metadata": _nested(100)})])
def test_deeply_nested_sigma_files_are_value_errors(tmp_path, text: str) -> None:
    path = tmp_path / "sigma.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}.*(nested|unknown field)"):
        SigmaCoupling.load(path)


def test_deeply_nested_descriptions_are_value_errors() -> None:
    with pytest.raises(ValueError, match="nested more than 64 levels"):
        SigmaCoupling.from_dict({**VALID_SIGMA, "metadata": _nested(100_000)})
    with pytest.raises(ValueError, match="nested more than 64 levels"):
        coupling_from_dict({**VALID_SIGMA, "metadata": _nested(100_000)})
    with pytest.raises(ValueError, match="metadata is nested more than 64 levels"):
        SigmaCoupling([1, 0], metadata=_nested(100_000))


@pytest.mark.parametrize("data, error, message", [
    ({**VALID_SIGMA, "type": 5}, TypeError, "field 'type' must be the string 'sigma', got integer 5"),
    ({**VALID_SIGMA, "type": ["sigma"]}, TypeError, "field 'type' must be the string 'sigma', got list"),
    ({**VALID_SIGMA, "type": None}, TypeError, "field 'type' must be the string 'sigma', got null"),
    ({**VALID_SIGMA, "fitted_on": "cora"}, ValueError, r"unknown field\(s\) \['fitted_on'\]"),
])
def test_sigma_fields_of_the_wrong_type_or_unknown_name_the_field(tmp_path, data, error, message) -> None:
    with pytest.raises(error, match=message):
        SigmaCoupling.from_dict(data)
    path = tmp_path / "sigma.json"
    path.write_text(json.dumps(data))
    with pytest.raises(error, match=f"{path}: .*{message}"):
        SigmaCoupling.load(path)


@pytest.mark.parametrize("data, error, message", [
    ({"type": 5}, TypeError, "walk-length coupling description's 'type' must be a string, got integer 5"),
    ({"type": ["iid"]}, TypeError, "'type' must be a string, got list"),
    ({"type": "iid", "seed": 3}, ValueError,
     r"walk-length coupling 'iid' description has unknown field\(s\) \['seed'\]"),
    ({"type": "antithetic", "p": 0.5}, ValueError, r"unknown field\(s\) \['p'\]"),
])
def test_registry_descriptions_are_checked(data, error, message) -> None:
    with pytest.raises(error, match=message):
        coupling_from_dict(data)


# ------------------------------------------------------------ users' couplings returning bad lengths
class _Returning(PairedWalkLengthCoupling, register=False):
    """A paired coupling returning whatever ``make(num_pairs)`` builds."""

    name = "returning"

    def __init__(self, make) -> None:  # type: ignore[no-untyped-def]
        self.make = make

    def sample_pairs(self, num_pairs, p_halt, rng):  # type: ignore[no-untyped-def]
        return self.make(num_pairs)


class _Lengths(WalkLengthCoupling, register=False):
    """A coupling whose ``sample_lengths`` returns whatever ``make(rows, walkers)`` builds."""

    name = "lengths"

    def __init__(self, make) -> None:  # type: ignore[no-untyped-def]
        self.make = make

    def sample_lengths(self, num_starts, num_walkers, p_halt, seed=None):  # type: ignore[no-untyped-def]
        return self.make(num_starts, num_walkers)


@pytest.mark.parametrize("make, message", [
    (lambda n: (np.full(n, 1.5), np.zeros(n, int)),
     r"_Returning.sample_pairs returned non-integer lengths \(e.g. 1.5\)"),
    (lambda n: (np.zeros(n - 1, int), np.zeros(n, int)), r"_Returning.sample_pairs returned 5 lengths .* expected 6"),
    (lambda n: (np.zeros(n, int), np.full(n, np.nan)), r"_Returning.sample_pairs returned NaN"),
    (lambda n: (np.zeros(n, int), -np.ones(n, int)), r"_Returning.sample_pairs returned a negative length"),
    (lambda n: (np.array(["1"] * n), np.zeros(n, int)), r"_Returning.sample_pairs returned lengths of dtype <U1"),
    (lambda n: np.zeros(n, int), r"_Returning.sample_pairs must return two arrays"),
])
def test_user_paired_couplings_returning_bad_lengths_name_the_class(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _Returning(make).sample_lengths(3, 4, 0.5, seed=0)


@pytest.mark.parametrize("make, message", [
    (lambda r, m: np.full((r, m), 2.5), r"_Lengths.sample_lengths returned non-integer lengths"),
    # The sampler asks for the lengths of one block of LENGTH_BLOCK = 64 node ids at a time.
    (lambda r, m: np.zeros((m, r), int), r"_Lengths.sample_lengths returned 256 lengths \(shape \(4, 64\)\); "
                                         r"expected .* shape \(64, 4\)"),
    (lambda r, m: np.zeros(r * m + 1, int), r"_Lengths.sample_lengths returned 257 lengths"),
    # Refused before the table narrows it to two bytes (65,537 would wrap round to 1).
    (lambda r, m: np.full((r, m), 65_537), r"a walk of length 65537 exceeds the supported 65535 steps"),
    (lambda r, m: [[1] * m] * r, None),
    (lambda r, m: np.full((r, m), 2.0), None),  # integer-valued floats are exact
    (lambda r, m: np.full((r, m), 70_000), None),  # capped by max_length before the table narrows it
])
def test_the_sampler_checks_user_couplings(make, message) -> None:  # type: ignore[no-untyped-def]
    from gp_couple.features.walks import sample_walk_lengths
    from gp_couple.graphs import grid_graph

    graph = grid_graph(3, 3)
    if message is None:
        _, lengths, _ = sample_walk_lengths(graph, 4, 0.5, _Lengths(make), seed=0, max_length=1)
        assert lengths.dtype == np.uint16 and lengths.max() == 1
        return
    with pytest.raises(ValueError, match=message):
        sample_walk_lengths(graph, 4, 0.5, _Lengths(make), seed=0)


class _ReversedSigma(SigmaCoupling, register=False):
    """A σ-coupling subclass whose pairs are not an entry-by-entry map of its uniforms (reversed order)."""

    def sample_pairs(self, num_pairs, p_halt, rng):
        first, second = super().sample_pairs(num_pairs, p_halt, rng)
        return first[::-1].copy(), second[::-1].copy()


class _ShiftedIID(IIDWalkLengthCoupling, register=False):
    """An i.i.d. subclass that draws its lengths its own way (a row shift: still geometric per walker)."""

    def sample_lengths(self, num_starts, num_walkers, p_halt, seed=None):
        return np.roll(super().sample_lengths(num_starts, num_walkers, p_halt, seed), 1, axis=0)


@pytest.mark.parametrize("coupling", [_ReversedSigma(np.arange(5)[::-1]), _ShiftedIID()], ids=type)
def test_subclasses_that_draw_their_own_way_get_rows_of_their_own_whole_draw(coupling) -> None:
    whole = coupling.sample_lengths(64, 4, 0.2, np.random.default_rng(3))
    rows = np.array([0, 9, 63])
    np.testing.assert_array_equal(coupling.sample_rows(rows, 64, 4, 0.2, np.random.default_rng(3)), whole[rows])
