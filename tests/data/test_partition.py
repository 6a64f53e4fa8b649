"""Tests of subfl.data.partition: sizes, disjointness, coverage, determinism, label statistics, errors."""
from __future__ import annotations

import numpy as np
import pytest

from subfl.data.partition import (PARTITIONS, dirichlet_allocation, dirichlet_equal, dirichlet_groups,
                                  dirichlet_prior, iid, k_classes, label_histogram, make_partition, natural, pachinko)

NUM_CLASSES = 10


def balanced_labels(per_class: int = 1000, num_classes: int = NUM_CLASSES) -> np.ndarray:
    """``per_class`` samples of each class, interleaved (0, 1, ..., 9, 0, 1, ...)."""
    return np.tile(np.arange(num_classes), per_class)


def skewed_labels() -> np.ndarray:
    """An unbalanced label vector: class c has 1000 * (c + 1) samples (55,000 in all)."""
    return np.repeat(np.arange(NUM_CLASSES), 1000 * (np.arange(NUM_CLASSES) + 1))


def assert_valid(parts: list[np.ndarray], num_samples: int, full: bool) -> None:
    """Sorted int64 arrays, pairwise disjoint, within range; all samples used when ``full``."""
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # sorted and no duplicates inside a client
        assert part.size == 0 or (part.min() >= 0 and part.max() < num_samples)
    everything = np.concatenate(parts)
    assert len(np.unique(everything)) == len(everything)  # disjoint across clients
    if full:
        assert len(everything) == num_samples


def same_partition(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def shares(labels: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    histogram = label_histogram(labels, parts, NUM_CLASSES)
    return histogram / histogram.sum(axis=1, keepdims=True)


# ------------------------------------------------------------------------------------------------
# iid
# ------------------------------------------------------------------------------------------------
def test_iid_sizes_coverage_and_label_balance() -> None:
    labels = balanced_labels()  # 10,000 samples
    parts = iid(labels, 7, np.random.default_rng(0))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 10_000  # 1429 x 6 + 1428
    assert_valid(parts, len(labels), full=True)
    # 1,428 samples per client: each class share is within 0.04 of 0.1 (~4.5 standard deviations)
    assert np.abs(shares(labels, parts) - 0.1).max() < 0.04


def test_iid_is_deterministic_per_seed_and_differs_across_seeds() -> None:
    labels = balanced_labels(100)
    assert same_partition(iid(labels, 5, np.random.default_rng(3)), iid(labels, 5, np.random.default_rng(3)))
    assert not same_partition(iid(labels, 5, np.random.default_rng(3)), iid(labels, 5, np.random.default_rng(4)))


# ------------------------------------------------------------------------------------------------
# Dirichlet with equal client sizes (PriSM) and with a prior (spectral sharding)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("partitioner", [dirichlet_equal, dirichlet_prior])
def test_dirichlet_equal_sizes_and_full_coverage(partitioner) -> None:
    labels = balanced_labels()
    parts = partitioner(labels, 10, 0.5, np.random.default_rng(0))
    assert [len(p) for p in parts] == [1000] * 10  # default samples_per_client = N // num_clients
    assert_valid(parts, len(labels), full=True)


@pytest.mark.parametrize("partitioner", [dirichlet_equal, dirichlet_prior])
def test_dirichlet_samples_per_client(partitioner) -> None:
    labels = balanced_labels()
    parts = partitioner(labels, 20, 0.3, np.random.default_rng(1), samples_per_client=123)
    assert [len(p) for p in parts] == [123] * 20
    assert_valid(parts, len(labels), full=False)


def test_dirichlet_large_alpha_matches_global_distribution() -> None:
    labels = balanced_labels(2000)  # 20,000 samples, clients take half of them (no class runs out)
    parts = dirichlet_equal(labels, 10, 1000.0, np.random.default_rng(0), samples_per_client=1000)
    # q ~ Dir(1000 * 1) is within ~0.003 of uniform; 1,000 draws add ~0.01: every share within 0.05
    assert np.abs(shares(labels, parts) - 0.1).max() < 0.05


def test_dirichlet_last_clients_absorb_leftovers_when_all_samples_are_used() -> None:
    labels = balanced_labels()  # 10 clients x 1,000 = all 10,000 samples: the last client takes the rest
    parts = dirichlet_equal(labels, 10, 1000.0, np.random.default_rng(0))
    histogram = label_histogram(labels, parts, NUM_CLASSES)
    assert histogram.sum(axis=0).tolist() == [1000] * 10
    assert np.abs(histogram[:5] / 1000 - 0.1).max() < 0.05


def test_dirichlet_small_alpha_gives_one_dominant_class() -> None:
    labels = balanced_labels()
    parts = dirichlet_equal(labels, 20, 0.01, np.random.default_rng(0), samples_per_client=100)
    dominant = shares(labels, parts).max(axis=1)
    assert dominant.mean() > 0.9


def test_dirichlet_prior_follows_unbalanced_global_frequencies() -> None:
    labels = skewed_labels()
    global_share = np.bincount(labels) / len(labels)
    parts = dirichlet_prior(labels, 10, 10_000.0, np.random.default_rng(0), samples_per_client=2000)
    # Dir(10^4 p) has mean p: the clients' shares follow the skewed p (0.018 ... 0.18), not uniform
    assert np.abs(shares(labels, parts) - global_share).max() < 0.05
    assert np.abs(shares(labels, parts).mean(axis=0) - global_share).max() < 0.015
    # whereas Dir(10^4 * 1) ignores the skew: the first clients take ~0.1 of class 0 (p_0 = 0.018), until
    # its 1,000 samples run out after five clients
    flat = dirichlet_equal(labels, 10, 10_000.0, np.random.default_rng(0), samples_per_client=2000)
    assert shares(labels, flat)[:4, 0].mean() > 0.08
    assert label_histogram(labels, flat, NUM_CLASSES)[:, 0].sum() == 1000


@pytest.mark.parametrize("partitioner", [dirichlet_equal, dirichlet_prior])
def test_dirichlet_determinism(partitioner) -> None:
    labels = balanced_labels(200)
    run = lambda seed: partitioner(labels, 8, 0.5, np.random.default_rng(seed))  # noqa: E731
    assert same_partition(run(11), run(11))
    assert not same_partition(run(11), run(12))


def test_dirichlet_renormalises_when_classes_run_out() -> None:
    # 5 clients x 200 samples with near one-hot priors, but only 100 samples per class: clients must
    # spill over to other classes, and every one of the 1,000 samples ends up used exactly once
    labels = balanced_labels(100)
    parts = dirichlet_equal(labels, 5, 0.01, np.random.default_rng(0), samples_per_client=200)
    assert [len(p) for p in parts] == [200] * 5
    assert_valid(parts, len(labels), full=True)


# ------------------------------------------------------------------------------------------------
# Per-class Dirichlet allocation (FedCR / Hsu et al.)
# ------------------------------------------------------------------------------------------------
def test_dirichlet_allocation_covers_all_and_respects_min_size() -> None:
    labels = balanced_labels()
    parts = dirichlet_allocation(labels, 20, 0.5, np.random.default_rng(0), min_size=10)
    assert_valid(parts, len(labels), full=True)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 10 and sizes.sum() == 10_000
    assert sizes.max() > 1.5 * sizes.min()  # unequal sizes, unlike dirichlet_equal


def test_dirichlet_allocation_alpha_controls_skew() -> None:
    labels = balanced_labels()
    high = dirichlet_allocation(labels, 10, 1000.0, np.random.default_rng(0))
    low = dirichlet_allocation(labels, 10, 0.1, np.random.default_rng(0), min_size=1)
    assert np.abs(shares(labels, high) - 0.1).max() < 0.03
    assert shares(labels, low).max(axis=1).mean() > 0.4


def test_dirichlet_allocation_determinism() -> None:
    labels = balanced_labels(200)
    run = lambda seed: dirichlet_allocation(labels, 8, 0.5, np.random.default_rng(seed))  # noqa: E731
    assert same_partition(run(5), run(5))
    assert not same_partition(run(5), run(6))


def test_dirichlet_allocation_gives_up_with_clear_error() -> None:
    labels = balanced_labels(20)  # 200 samples, 20 clients: min_size=10 needs an exactly even split
    with pytest.raises(ValueError, match="min_size=10"):
        dirichlet_allocation(labels, 20, 0.01, np.random.default_rng(0), min_size=10, max_tries=5)


# ------------------------------------------------------------------------------------------------
# k classes per client
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_clients, k", [(10, 2), (7, 3), (3, 1), (25, 10)])
def test_k_classes_exactly_k_each_and_balanced_use(num_clients: int, k: int) -> None:
    labels = balanced_labels(300)
    parts = k_classes(labels, num_clients, k, np.random.default_rng(0))
    histogram = label_histogram(labels, parts, NUM_CLASSES)
    assert ((histogram > 0).sum(axis=1) == k).all()
    holders = (histogram > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1  # classes are used evenly
    if num_clients * k >= NUM_CLASSES:
        assert (holders > 0).all()
        assert_valid(parts, len(labels), full=True)  # every class used -> every sample assigned
    else:
        assert_valid(parts, len(labels), full=False)
    # a class's samples are split evenly among its holders
    for c in range(NUM_CLASSES):
        counts = histogram[:, c][histogram[:, c] > 0]
        if len(counts):
            assert counts.max() - counts.min() <= 1


def test_k_classes_determinism() -> None:
    labels = balanced_labels(100)
    assert same_partition(k_classes(labels, 10, 2, np.random.default_rng(1)),
                          k_classes(labels, 10, 2, np.random.default_rng(1)))
    assert not same_partition(k_classes(labels, 10, 2, np.random.default_rng(1)),
                              k_classes(labels, 10, 2, np.random.default_rng(2)))


# ------------------------------------------------------------------------------------------------
# Pachinko allocation (Reddi et al. 2021)
# ------------------------------------------------------------------------------------------------
def cifar100_like_labels(per_fine: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """20 coarse classes with 5 fine labels each (fine f belongs to coarse f // 5), like CIFAR-100."""
    fine = np.tile(np.arange(100), per_fine)
    return fine // 5, fine


def test_pachinko_sizes_coverage_and_structure() -> None:
    coarse, fine = cifar100_like_labels()  # 5,000 samples
    parts = pachinko(coarse, fine, 50, 0.1, 10.0, np.random.default_rng(0))
    assert [len(p) for p in parts] == [100] * 50
    assert_valid(parts, len(fine), full=True)
    for part in parts:  # a sample's coarse label is its fine label's coarse class
        assert np.array_equal(coarse[part], fine[part] // 5)


def test_pachinko_alpha_concentrates_coarse_and_beta_fine() -> None:
    coarse, fine = cifar100_like_labels(100)  # 10,000 samples
    parts = pachinko(coarse, fine, 40, 0.01, 1000.0, np.random.default_rng(0), samples_per_client=50)
    coarse_hist = np.stack([np.bincount(coarse[p], minlength=20) for p in parts])
    # alpha = 0.01 over 20 coarse classes: a client's samples come mostly from one coarse class
    assert (coarse_hist.max(axis=1) / 50).mean() > 0.75
    # beta = 1000: within its dominant coarse class, fine labels are close to uniform (5 of them)
    fine_spread = []
    for p, row in zip(parts, coarse_hist):
        top = row.argmax()
        if row[top] >= 40:
            counts = np.bincount(fine[p][coarse[p] == top] - 5 * top, minlength=5)
            fine_spread.append(counts.max() / counts.sum())
    assert len(fine_spread) > 10 and np.mean(fine_spread) < 0.45  # one-hot would be 1.0


def test_pachinko_small_beta_concentrates_fine_labels() -> None:
    coarse, fine = cifar100_like_labels(100)
    parts = pachinko(coarse, fine, 40, 1000.0, 0.01, np.random.default_rng(0), samples_per_client=60)
    # alpha large: coarse classes spread out; beta small: each (client, coarse) pair uses ~one fine label
    distinct_fine_per_coarse = []
    for p in parts:
        for c in np.unique(coarse[p]):
            distinct_fine_per_coarse.append(len(np.unique(fine[p][coarse[p] == c])))
    assert np.mean(distinct_fine_per_coarse) < 1.3


def test_pachinko_determinism_and_bad_hierarchy() -> None:
    coarse, fine = cifar100_like_labels(20)
    run = lambda seed: pachinko(coarse, fine, 10, 0.5, 0.5, np.random.default_rng(seed))  # noqa: E731
    assert same_partition(run(0), run(0))
    assert not same_partition(run(0), run(1))
    broken = coarse.copy()
    broken[0] = (broken[0] + 1) % 20  # fine label 0 now appears under two coarse classes
    with pytest.raises(ValueError, match="exactly one coarse"):
        pachinko(broken, fine, 10, 0.5, 0.5, np.random.default_rng(0))


# ------------------------------------------------------------------------------------------------
# natural split
# ------------------------------------------------------------------------------------------------
def test_natural_equals_groups() -> None:
    groups = np.array([3, 1, 3, 7, 1, 1, 7, 3, 3])
    parts = natural(groups)
    assert [p.tolist() for p in parts] == [[1, 4, 5], [0, 2, 7, 8], [3, 6]]  # groups 1, 3, 7 ascending
    assert_valid(parts, len(groups), full=True)
    assert [p.tolist() for p in natural(groups, max_clients=2)] == [[1, 4, 5], [0, 2, 7, 8]]


def test_natural_via_make_partition_caps_clients() -> None:
    groups = np.repeat(np.arange(30), 4)
    parts = make_partition("natural", groups, 12, np.random.default_rng(0), groups=groups)
    assert len(parts) == 12 and all(np.all(groups[p] == i) for i, p in enumerate(parts))


# ------------------------------------------------------------------------------------------------
# make_partition and label_histogram
# ------------------------------------------------------------------------------------------------
def test_make_partition_dispatches_like_the_functions() -> None:
    labels = balanced_labels(50)
    coarse = labels // 5
    rng = np.random.default_rng
    cases = [
        (make_partition("iid", labels, 4, rng(0)), iid(labels, 4, rng(0))),
        (make_partition("dirichlet", labels, 4, rng(0), alpha=0.5), dirichlet_equal(labels, 4, 0.5, rng(0))),
        (make_partition("dirichlet_prior", labels, 4, rng(0), alpha=0.5),
         dirichlet_prior(labels, 4, 0.5, rng(0))),
        (make_partition("dirichlet_allocation", labels, 4, rng(0), alpha=0.5),
         dirichlet_allocation(labels, 4, 0.5, rng(0))),
        (make_partition("k_classes", labels, 4, rng(0), k=2), k_classes(labels, 4, 2, rng(0))),
        (make_partition("pachinko", labels, 4, rng(0), alpha=0.5, beta=0.5, coarse_labels=coarse),
         pachinko(coarse, labels, 4, 0.5, 0.5, rng(0))),
        (make_partition("dirichlet_groups", labels, 4, rng(0), alpha=0.5, client_groups=[0, 1, 0, 1]),
         dirichlet_groups(labels, [0, 1, 0, 1], 0.5, rng(0))),
    ]
    for got, expected in cases:
        assert same_partition(got, expected)
    assert set(PARTITIONS) == {"iid", "dirichlet", "dirichlet_prior", "dirichlet_allocation", "dirichlet_groups",
                               "k_classes", "pachinko", "natural"}


def test_label_histogram_counts() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2])
    histogram = label_histogram(labels, [np.array([0, 1]), np.array([2, 3, 4, 5])], 4)
    assert histogram.tolist() == [[1, 1, 0, 0], [0, 1, 3, 0]]


LABELS = balanced_labels(10)  # 100 samples
RNG = np.random.default_rng


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: make_partition("shards", LABELS, 4, RNG(0)), ValueError, "one of"),
    (lambda: make_partition("dirichlet", LABELS, 4, RNG(0)), ValueError, "alpha"),
    (lambda: make_partition("dirichlet_prior", LABELS, 4, RNG(0), alpha=0), ValueError, "alpha"),
    (lambda: make_partition("dirichlet_allocation", LABELS, 4, RNG(0), alpha=-1.0), ValueError, "alpha"),
    (lambda: make_partition("k_classes", LABELS, 4, RNG(0)), ValueError, "k is required"),
    (lambda: make_partition("natural", LABELS, 4, RNG(0)), ValueError, "groups"),
    (lambda: make_partition("pachinko", LABELS, 4, RNG(0), alpha=1.0, beta=1.0), ValueError, "coarse_labels"),
    (lambda: make_partition("pachinko", LABELS, 4, RNG(0), alpha=1.0, coarse_labels=LABELS // 5),
     ValueError, "beta"),
    (lambda: iid(LABELS, 0, RNG(0)), ValueError, "num_clients"),
    (lambda: iid(LABELS, 101, RNG(0)), ValueError, "num_clients"),
    (lambda: iid(LABELS, 2.5, RNG(0)), ValueError, "num_clients"),
    (lambda: iid(LABELS, 4, 0), TypeError, "rng"),
    (lambda: iid(np.array([]), 4, RNG(0)), ValueError, "labels"),
    (lambda: iid(np.array([0, -1, 2]), 2, RNG(0)), ValueError, "labels"),
    (lambda: iid(np.array([[0, 1], [1, 0]]), 2, RNG(0)), ValueError, "labels"),
    (lambda: iid(np.array([0.5, 1.0]), 2, RNG(0)), ValueError, "labels"),
    (lambda: dirichlet_equal(LABELS, 4, float("nan"), RNG(0)), ValueError, "alpha"),
    (lambda: dirichlet_equal(LABELS, 4, 1.0, RNG(0), samples_per_client=26), ValueError, "samples_per_client"),
    (lambda: dirichlet_equal(LABELS, 4, 1.0, RNG(0), samples_per_client=0), ValueError, "samples_per_client"),
    (lambda: dirichlet_allocation(LABELS, 4, 1.0, RNG(0), min_size=26), ValueError, "min_size"),
    (lambda: dirichlet_allocation(LABELS, 4, 1.0, RNG(0), max_tries=0), ValueError, "max_tries"),
    (lambda: k_classes(LABELS, 4, 0, RNG(0)), ValueError, "k must"),
    (lambda: k_classes(LABELS, 4, 11, RNG(0)), ValueError, "k must"),
    (lambda: k_classes(LABELS, 100, 10, RNG(0)), ValueError, "holders"),
    (lambda: pachinko(LABELS // 5, LABELS[:50], 4, 1.0, 1.0, RNG(0)), ValueError, "same length"),
    (lambda: pachinko(LABELS // 5, LABELS, 4, 1.0, 0.0, RNG(0)), ValueError, "beta"),
    (lambda: natural(LABELS, max_clients=0), ValueError, "max_clients"),
    (lambda: label_histogram(LABELS, [np.arange(3)], 5), ValueError, "num_classes"),
])
def test_bad_inputs_raise_naming_the_parameter(call, error, fragment) -> None:
    with pytest.raises(error, match=fragment):
        call()


def test_local_test_split_holds_out_the_fraction_and_keeps_one_training_sample():
    from subfl.data import local_test_split
    parts = [np.arange(10), np.arange(10, 13), np.array([13])]
    train, test = local_test_split(parts, 0.3, np.random.default_rng(0))
    assert [len(t) for t in test] == [3, 1, 0] and [len(t) for t in train] == [7, 2, 1]
    for whole, tr, te in zip(parts, train, test):
        assert sorted(np.concatenate([tr, te]).tolist()) == whole.tolist()
    with pytest.raises(ValueError, match="fraction"):
        local_test_split(parts, 1.0, np.random.default_rng(0))


def test_dirichlet_allocation_is_the_per_class_cut_of_its_first_accepted_draw() -> None:
    """Each draw cuts every class's shuffled samples at the cumulative Dirichlet proportions; the first draw whose
    smallest client holds min_size samples is returned (the sizes are checked before any index set is built)."""
    labels = np.random.default_rng(3).integers(0, 10, 3000)
    rng = np.random.default_rng(7)
    parts = dirichlet_allocation(labels, 40, 0.3, np.random.default_rng(7), min_size=20)
    tries = 0
    while True:  # the reference: build every draw in full, then judge it
        tries += 1
        pieces: list[list[np.ndarray]] = [[] for _ in range(40)]
        for c in np.unique(labels):
            pool = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(40, 0.3))) * len(pool)).astype(np.int64)[:-1]
            for client, piece in enumerate(np.split(pool, cuts)):
                pieces[client].append(piece)
        reference = [np.sort(np.concatenate(p)) for p in pieces]
        if min(len(r) for r in reference) >= 20:
            break
    assert tries > 1  # this request rejects some draws before it accepts one
    assert len(parts) == 40 and all(np.array_equal(a, b) for a, b in zip(parts, reference))


# ---- dirichlet_groups (CAFF Sec. 4.4: data that follow the devices' groups) ----------------------------------
def _group_shares(labels: np.ndarray, parts: list[np.ndarray], groups: np.ndarray) -> np.ndarray:
    """Per class, the fraction of its samples held by each group (classes × sorted groups)."""
    names = np.unique(groups)
    held = np.zeros((labels.max() + 1, names.size))
    for part, group in zip(parts, groups):
        held[:, np.searchsorted(names, group)] += np.bincount(labels[part], minlength=labels.max() + 1)
    return held / held.sum(axis=1, keepdims=True)


def test_dirichlet_groups_assigns_every_sample_once_and_evenly_inside_a_group() -> None:
    labels = np.repeat(np.arange(10), 300)
    groups = np.array([0.5, 1.0] * 10)  # 20 clients, two groups of 10
    parts = make_partition("dirichlet_groups", labels, 20, np.random.default_rng(0), alpha=0.1, client_groups=groups)
    joined = np.concatenate(parts)
    assert joined.size == labels.size and np.unique(joined).size == labels.size
    for name in (0.5, 1.0):
        sizes = [len(parts[c]) for c in np.flatnonzero(groups == name)]
        assert max(sizes) - min(sizes) <= 1  # an even deal inside the group


def test_dirichlet_groups_alpha_sets_how_much_a_class_follows_one_group() -> None:
    """α = 0.1 (CAFF): a class sits mostly in one group (mean majority share ≥ 0.85 over 100 classes); α = 100: about
    half in each (mean |share − 0.5| ≤ 0.05). The group shares are Dir(α, α) draws: E[max] = 0.5 + E|q − 0.5|."""
    labels = np.repeat(np.arange(100), 200)
    groups = np.array([0.5] * 10 + [1.0] * 10)
    shares = {a: _group_shares(labels, make_partition("dirichlet_groups", labels, 20, np.random.default_rng(1),
                                                      alpha=a, client_groups=groups), groups) for a in (0.1, 100.0)}
    assert shares[0.1].max(axis=1).mean() >= 0.85
    assert np.abs(shares[100.0][:, 0] - 0.5).mean() <= 0.05


def test_dirichlet_groups_follows_the_engines_keep_ratio_groups() -> None:
    """In a run the groups are the clients' static keep-ratio levels: the weak clients of the engine's profiles
    hold, per class, the shares the partition gave the weak group."""
    from subfl.experiments import make_config, prepare_data

    config = make_config("caff", "digits", "mlp", "dirichlet_groups", scale="ci", alpha=0.1, num_clients=8,
                         heterogeneity="0.5:0.5,1.0:0.5", clients_per_round=2)
    data, _, parts = prepare_data(config)
    levels = np.array([p.keep_ratio for p in config.heterogeneity_setting.profiles(8, config.seed, 1)])
    shares = _group_shares(np.asarray(data.train.labels), parts, levels)
    assert shares.max(axis=1).mean() >= 0.7  # classes follow the groups (digits at ci scale: few samples a class)
    again = prepare_data(config)[2]
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_dirichlet_groups_refuses_what_it_cannot_do() -> None:
    labels = np.repeat(np.arange(3), 4)
    with pytest.raises(ValueError, match="client_groups"):
        make_partition("dirichlet_groups", labels, 4, np.random.default_rng(0), alpha=0.1)
    with pytest.raises(ValueError, match="group 1.0"):  # 12 samples cannot feed a group of 11 clients
        make_partition("dirichlet_groups", labels, 12, np.random.default_rng(0), alpha=0.01,
                       client_groups=np.array([0.5] + [1.0] * 11))
    from subfl.experiments import make_config
    from subfl.experiments.config import ConfigError

    with pytest.raises(ConfigError, match="partition='dirichlet_groups'"):
        make_config("fedavg", "digits", "mlp", "dirichlet_groups", scale="ci", alpha=0.1)


def test_largest_remainder_counts_sum_to_the_total_and_round_the_largest_remainders_up() -> None:
    from subfl.data.partition import largest_remainder_counts
    # 0.45·7 = 3.15, 0.35·7 = 2.45, 0.2·7 = 1.4: floors 3 / 2 / 1 leave one, which goes to the largest part (.45)
    assert largest_remainder_counts([0.45, 0.35, 0.2], 7).tolist() == [3, 3, 1]
    assert largest_remainder_counts([0.5, 0.5], 3).tolist() == [2, 1]  # a tie goes to the first
    assert largest_remainder_counts([1.0], 0).tolist() == [0]
