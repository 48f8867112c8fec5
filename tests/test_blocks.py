"""Block detection in layer × layer similarity matrices (layersim.similarity.blocks): planted blocks
are recovered, noise below the stated level changes nothing, a matrix without structure is one block."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity.blocks import MIN_CONTRAST, Blocks, agreement, find_blocks, stability


def planted(rng: np.random.Generator, sizes: list[int], within=(0.7, 0.9), between=(0.1, 0.3)) -> np.ndarray:
    """A symmetric matrix with blocks of `sizes` layers: cells drawn from `within` inside a block and from
    `between` across blocks, 1 on the diagonal."""
    labels = np.repeat(np.arange(len(sizes)), sizes)
    n = len(labels)
    low_high = np.where(labels[:, None] == labels[None, :], 1, 0)
    cells = np.where(low_high, rng.uniform(*within, (n, n)), rng.uniform(*between, (n, n)))
    cells = np.triu(cells, 1)
    return cells + cells.T + np.eye(n)


def starts_of(sizes: list[int]) -> tuple[int, ...]:
    return tuple(int(s) for s in np.cumsum([0, *sizes[:-1]]))


@pytest.mark.parametrize("seed", range(20))
def test_planted_blocks_are_recovered_exactly(seed):
    rng = np.random.default_rng(seed)
    sizes = list(rng.integers(1, 6, rng.integers(2, 5)))
    found = find_blocks(planted(rng, sizes))
    assert found.starts == starts_of(sizes)
    assert found.contrast > 0.4 and found.num_layers == sum(sizes)


@pytest.mark.parametrize("seed", range(10))
def test_a_matrix_without_structure_is_one_block(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 14))
    noise = np.triu(rng.uniform(-0.02, 0.02, (n, n)), 1)
    found = find_blocks(0.8 + noise + noise.T)
    assert found.starts == (0,) and found.between is None and found.within == pytest.approx(0.8, abs=0.02)


@pytest.mark.parametrize("seed", range(20))
def test_symmetric_noise_below_the_stated_level_changes_nothing(seed):
    """Noise of at most η per cell changes nothing when every within cell is more than 2η above the clean
    matrix's mean off-diagonal similarity and every between cell more than 2η below it (the module's rule)."""
    rng = np.random.default_rng(100 + seed)
    sizes = list(rng.integers(2, 6, 3))
    clean = planted(rng, sizes, within=(0.75, 0.8), between=(0.2, 0.25))
    labels = np.repeat(np.arange(len(sizes)), sizes)
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(len(labels), dtype=bool)
    margin = min(clean[same & off].min() - clean[off].mean(), clean[off].mean() - clean[~same].max())
    eta = 0.99 * margin / 2
    for _ in range(5):
        noise = np.triu(rng.choice([-eta, eta], clean.shape), 1)  # the largest noise the rule allows
        assert find_blocks(clean + noise + noise.T).starts == find_blocks(clean).starts == starts_of(sizes)


def test_blocks_do_not_depend_on_a_constant_shift_or_on_which_triangle_holds_the_values():
    rng = np.random.default_rng(7)
    s = planted(rng, [3, 4, 2])
    assert find_blocks(s + 0.3).starts == find_blocks(s).starts
    upper = np.triu(s, 1)
    lower_only = upper.T * 2 + np.eye(len(s))  # (S + Sᵀ)/2 is the same matrix
    assert find_blocks(lower_only).starts == find_blocks(s).starts


def test_a_weak_contrast_is_one_block():
    s = planted(np.random.default_rng(3), [3, 3], within=(0.52, 0.53), between=(0.50, 0.51))
    assert find_blocks(s).starts == (0,)
    assert find_blocks(s, min_contrast=0.0).starts == (0, 3)
    assert MIN_CONTRAST == 0.05


def test_agreement_and_stability_small_exact_cases():
    two, one = Blocks((0, 2), 4, None, None), Blocks((0,), 4, None, None)
    assert agreement(two, two) == 1.0
    assert agreement(two, one) == pytest.approx(2 / 6)  # pairs (0,1) and (2,3) agree, the 4 across do not
    assert stability(two, [two, one]) == pytest.approx((1 + 2 / 6) / 2)
    assert two.spans == [(0, 1), (2, 3)] and two.labels.tolist() == [0, 0, 1, 1]
    with pytest.raises(LayersimError, match="4 and 5 layers"):
        agreement(two, Blocks((0,), 5, None, None))


def test_bad_matrices_are_refused():
    with pytest.raises(LayersimError, match=r"square layer × layer matrix, got shape \(2, 3\)"):
        find_blocks(np.zeros((2, 3)))
    with pytest.raises(LayersimError, match="NaN or infinite"):
        find_blocks(np.array([[1.0, np.nan], [np.nan, 1.0]]))


def test_layers_before_the_first_block_are_left_out_of_labels_and_agreement():
    late, full = Blocks((1, 3), 5, None, None), Blocks((0, 3), 5, None, None)
    assert late.labels.tolist() == [-1, 0, 0, 1, 1] and late.spans == [(1, 2), (3, 4)]
    assert agreement(late, full) == 1.0  # the same split of the layers both segment
