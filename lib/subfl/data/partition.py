"""Partitioners: how a dataset's samples are split among federated clients.

Every partitioner returns ``list[np.ndarray]``: one sorted int64 array of sample indices per client, the
arrays pairwise disjoint. Randomness comes only from the ``rng`` argument (a ``numpy.random.Generator``),
so a partition is a pure function of its inputs and the generator's state.

Which paper uses which:

* :func:`iid` -- uniform random equal shares (every paper's IID baseline).
* :func:`dirichlet_equal` -- equal-size clients with class priors ``q ~ Dir(alpha 1)`` (PriSM, Niu et al.
  TMLR 2023).
* :func:`dirichlet_prior` -- as above with ``q ~ Dir(alpha p)``, ``p`` the global class frequencies
  (Hsu, Qi & Brown 2019, "Measuring the effects of non-identical data distribution"; spectral sharding,
  Korzhenkov & Louizos).
* :func:`dirichlet_allocation` -- per class, proportions over clients ``~ Dir(alpha)``; clients of unequal
  size (Yurochkin et al. 2019 / Wang et al. 2020 code, used by FedCR and NIID-Bench; often also cited as
  Hsu et al. 2019).
* :func:`k_classes` -- each client holds exactly ``k`` classes (McMahan et al. 2017 "pathological non-IID";
  FLANC, FedP3).
* :func:`pachinko` -- two-level Pachinko allocation over coarse/fine labels (Reddi et al., ICLR 2021).
* :func:`dirichlet_groups` -- per class, proportions over *groups of clients* ``~ Dir(alpha)``, then an even
  random split inside each group: data that follow the clients' groups (device strength; CAFF Sec. 4.4 after
  CoCoFL).
* :func:`natural` -- one client per natural group (writer, speaking role; LEAF).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

PARTITIONS: tuple[str, ...] = ("iid", "dirichlet", "dirichlet_prior", "dirichlet_allocation", "dirichlet_groups",
                               "k_classes", "pachinko", "natural")
"""Names accepted by :func:`make_partition` (``"dirichlet"`` is :func:`dirichlet_equal`)."""


# ------------------------------------------------------------------------------------------------
# validation helpers
# ------------------------------------------------------------------------------------------------
def _check_labels(labels: Any, name: str = "labels") -> np.ndarray:
    array = np.asarray(labels)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of non-negative ints, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        if np.issubdtype(array.dtype, np.floating) and np.all(np.mod(array, 1) == 0):
            array = array.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.min() < 0:
        raise ValueError(f"{name} must be non-negative, got minimum {array.min()}")
    return array.astype(np.int64, copy=False)


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (numpy.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    return rng


def _check_count(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be an int {bound}, got {value}")
    return int(value)


def _check_concentration(name: str, value: Any) -> float:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
            or not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (the Dirichlet concentration), got {value!r}")
    return float(value)


def _samples_per_client(value: Any, num_samples: int, num_clients: int) -> int:
    if value is None:
        value = num_samples // num_clients
    maximum = num_samples // num_clients
    return _check_count("samples_per_client", value, 1, maximum)


def _sorted_parts(parts: Sequence[Sequence[int] | np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(part, dtype=np.int64)) for part in parts]


def _class_pools(labels: np.ndarray, classes: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """For each class (in ``classes`` order), its sample indices in random order."""
    return [rng.permutation(np.flatnonzero(labels == c)) for c in classes]


def _renormalised(prior: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """``prior`` restricted to entries with ``remaining > 0``, renormalised.

    When the prior puts (numerically) no mass on what is left -- possible for tiny Dirichlet
    concentrations -- fall back to drawing proportionally to what remains (uniform over leftover samples).
    """
    masked = np.where(remaining > 0, prior, 0.0)
    total = masked.sum()
    if total <= 1e-300 or not np.isfinite(total):
        masked = remaining.astype(np.float64)
        total = masked.sum()
    return masked / total


def _draw_counts(prior: np.ndarray, remaining: np.ndarray, wanted: int,
                 rng: np.random.Generator) -> np.ndarray:
    """How many samples of each category one client takes: ``wanted`` draws from ``prior``, without
    replacement from the pools of sizes ``remaining``; draws that land on an exhausted category are redrawn
    from the prior renormalised over categories that still have samples."""
    taken = np.zeros(len(prior), dtype=np.int64)
    left = remaining.copy()
    need = wanted
    while need > 0:
        counts = rng.multinomial(need, _renormalised(prior, left))
        got = np.minimum(counts, left)
        taken += got
        left -= got
        need -= int(got.sum())
    return taken


# ------------------------------------------------------------------------------------------------
# partitioners
# ------------------------------------------------------------------------------------------------
def iid(labels: Any, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """IID split: a random permutation cut into ``num_clients`` equal shares (sizes differ by at most one;
    every sample is assigned). The IID baseline of McMahan et al. (2017) and of every paper in the book."""
    labels = _check_labels(labels)
    num_clients = _check_count("num_clients", num_clients, 1, len(labels))
    rng = _check_rng(rng)
    return _sorted_parts(np.array_split(rng.permutation(len(labels)), num_clients))


def _dirichlet_by_prior(labels: np.ndarray, num_clients: int, concentration: np.ndarray,
                        rng: np.random.Generator, samples_per_client: int | None) -> list[np.ndarray]:
    """Equal-size clients; client ``i`` draws a class prior ``q_i ~ Dir(concentration)`` and then its samples
    by label from ``q_i`` without replacement (renormalising over classes that still have samples)."""
    classes = np.unique(labels)
    per_client = _samples_per_client(samples_per_client, len(labels), num_clients)
    pools = _class_pools(labels, classes, rng)
    remaining = np.array([len(pool) for pool in pools], dtype=np.int64)
    used = np.zeros(len(classes), dtype=np.int64)
    parts = []
    for _ in range(num_clients):
        prior = rng.dirichlet(concentration)
        counts = _draw_counts(prior, remaining, per_client, rng)
        parts.append(np.concatenate([pools[c][used[c]:used[c] + counts[c]] for c in range(len(classes))]))
        used += counts
        remaining -= counts
    return _sorted_parts(parts)


def dirichlet_equal(labels: Any, num_clients: int, alpha: float, rng: np.random.Generator,
                    samples_per_client: int | None = None) -> list[np.ndarray]:
    """Equal-size non-IID clients with class priors ``q ~ Dir(alpha 1)`` (PriSM, Niu et al. TMLR 2023;
    the uniform-prior case of Hsu, Qi & Brown 2019, whose concentration is ``alpha p`` = ``alpha / C``).

    Each client draws ``samples_per_client`` (default ``N // num_clients``) samples by label from its ``q``,
    without replacement, renormalising ``q`` over the classes that still have samples. ``alpha -> inf`` is
    IID; ``alpha -> 0`` gives (nearly) one class per client.
    """
    labels = _check_labels(labels)
    num_clients = _check_count("num_clients", num_clients, 1, len(labels))
    alpha = _check_concentration("alpha", alpha)
    rng = _check_rng(rng)
    concentration = np.full(len(np.unique(labels)), alpha)
    return _dirichlet_by_prior(labels, num_clients, concentration, rng, samples_per_client)


def dirichlet_prior(labels: Any, num_clients: int, alpha: float, rng: np.random.Generator,
                    samples_per_client: int | None = None) -> list[np.ndarray]:
    """Equal-size non-IID clients with class priors ``q ~ Dir(alpha p)``, ``p`` the global class frequencies
    (spectral sharding, Korzhenkov & Louizos; Hsu et al. 2019). Otherwise as :func:`dirichlet_equal`: with
    ``E[q] = p`` the clients' average label distribution matches the dataset's even when it is unbalanced.
    """
    labels = _check_labels(labels)
    num_clients = _check_count("num_clients", num_clients, 1, len(labels))
    alpha = _check_concentration("alpha", alpha)
    rng = _check_rng(rng)
    _, counts = np.unique(labels, return_counts=True)
    concentration = alpha * counts / counts.sum()
    return _dirichlet_by_prior(labels, num_clients, concentration, rng, samples_per_client)


def dirichlet_allocation(labels: Any, num_clients: int, alpha: float, rng: np.random.Generator,
                         min_size: int = 10, max_tries: int = 1000) -> list[np.ndarray]:
    """Per-class Dirichlet allocation (Yurochkin et al. 2019; Wang et al. 2020; used by FedCR and
    NIID-Bench): for each class, proportions over the clients ``~ Dir(alpha 1)`` cut that class's shuffled
    samples; every sample is assigned and client sizes vary. The whole allocation is redrawn until every
    client has at least ``min_size`` samples (``ValueError`` after ``max_tries`` draws).
    """
    labels = _check_labels(labels)
    num_clients = _check_count("num_clients", num_clients, 1, len(labels))
    alpha = _check_concentration("alpha", alpha)
    rng = _check_rng(rng)
    min_size = _check_count("min_size", min_size, 0, len(labels) // num_clients)
    max_tries = _check_count("max_tries", max_tries, 1)
    class_members = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(max_tries):
        # A draw is judged on its client sizes alone (a few vectors per class); its index sets are built only
        # when it is accepted, so rejecting a hopeless request costs milliseconds per draw, not seconds.
        pools, all_cuts = [], []
        sizes = np.zeros(num_clients, dtype=np.int64)
        for members in class_members:
            pool = rng.permutation(members)
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions) * len(pool)).astype(np.int64)[:-1]
            sizes += np.diff(cuts, prepend=0, append=len(pool))
            pools.append(pool)
            all_cuts.append(cuts)
        if sizes.min() >= min_size:
            pieces = [np.split(pool, cuts) for pool, cuts in zip(pools, all_cuts)]
            return _sorted_parts([np.concatenate([per_class[client] for per_class in pieces])
                                  for client in range(num_clients)])
    raise ValueError(f"dirichlet_allocation found no split with every client holding min_size={min_size} "
                     f"samples in max_tries={max_tries} draws (alpha={alpha}, num_clients={num_clients}, "
                     f"{len(labels)} samples); accepted: a smaller min_size, a larger alpha or fewer clients")


def largest_remainder_counts(shares: Any, total: int) -> np.ndarray:
    """Whole counts summing to ``total`` in the proportions ``shares`` (which sum to 1): each ``⌊share·total⌋``,
    plus one for the largest fractional parts (ties: the first) until the total is reached."""
    raw = np.asarray(shares, dtype=np.float64) * total
    counts = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


def dirichlet_groups(labels: Any, client_groups: Any, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Data that follow the clients' groups: for each class, proportions over the ``G`` groups ``~ Dir(alpha 1)``
    cut that class's shuffled samples (largest-remainder counts); each group's samples are then shuffled and dealt
    evenly (sizes differ by at most one) to the group's clients.

    ``client_groups``: one label per client (any hashable values, e.g. each client's keep ratio); groups are taken
    in sorted order. With a small ``alpha`` most of a class sits in one group — CAFF's split in which a class is
    held mainly by the weak or mainly by the strong devices (Sec. 4.4, ``alpha = 0.1`` after CoCoFL);
    within a group the data are i.i.d. A group that receives fewer samples than it has clients is a
    ``ValueError`` (every client needs a sample).
    """
    labels = _check_labels(labels)
    groups = np.asarray(client_groups)
    if groups.ndim != 1 or groups.size == 0:
        raise ValueError(f"client_groups must be a non-empty 1-D array with one group label per client, got shape "
                         f"{groups.shape}")
    alpha = _check_concentration("alpha", alpha)
    rng = _check_rng(rng)
    names = np.unique(groups)
    pools: list[list[np.ndarray]] = [[] for _ in names]
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        counts = largest_remainder_counts(rng.dirichlet(np.full(len(names), alpha)), len(members))
        for g, piece in enumerate(np.split(members, np.cumsum(counts)[:-1])):
            pools[g].append(piece)
    parts: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * groups.size
    for g, name in enumerate(names):
        clients = np.flatnonzero(groups == name)
        pool = rng.permutation(np.concatenate(pools[g]))
        if pool.size < clients.size:
            label = name.item() if isinstance(name, np.generic) else name
            raise ValueError(f"dirichlet_groups gave group {label!r} {pool.size} samples for its {clients.size} "
                             f"clients (alpha={alpha}, {len(labels)} samples); accepted: more samples, a larger "
                             "alpha or fewer clients in that group")
        for client, piece in zip(clients, np.array_split(pool, clients.size)):
            parts[client] = piece
    return _sorted_parts(parts)


def k_classes(labels: Any, num_clients: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each client holds exactly ``k`` distinct classes ("pathological non-IID", McMahan et al. 2017;
    FLANC, FedP3).

    Classes are dealt round-robin over a random class order, so each class is held by
    ``floor`` or ``ceil(num_clients k / C)`` clients and every class is used when ``num_clients k >= C``;
    a class's shuffled samples are split evenly among the clients that hold it. Samples of unused classes
    are left out.
    """
    labels = _check_labels(labels)
    classes = np.unique(labels)
    num_clients = _check_count("num_clients", num_clients, 1, len(labels))
    k = _check_count("k", k, 1, len(classes))
    rng = _check_rng(rng)
    order = rng.permutation(classes)
    slots = order[np.arange(num_clients * k) % len(classes)].reshape(num_clients, k)
    slots = slots[rng.permutation(num_clients)]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        holders = np.flatnonzero((slots == c).any(axis=1))
        if len(holders) == 0:
            continue
        pool = rng.permutation(np.flatnonzero(labels == c))
        if len(pool) < len(holders):
            raise ValueError(f"class {c} has {len(pool)} samples but k={k} with num_clients={num_clients} "
                             f"gives it {len(holders)} holders; accepted: k * num_clients <= "
                             f"{len(classes)} x the smallest class size")
        for client, piece in zip(holders, np.array_split(pool, len(holders))):
            parts[client].append(piece)
    return _sorted_parts([np.concatenate(pieces) for pieces in parts])


def pachinko(coarse_labels: Any, fine_labels: Any, num_clients: int, alpha: float, beta: float,
             rng: np.random.Generator, samples_per_client: int | None = None) -> list[np.ndarray]:
    """Two-level Pachinko allocation (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, after
    Li & McCallum's Pachinko allocation, ICML 2006), as used for CIFAR-100's 20 coarse / 100 fine labels.

    Client ``i`` draws a coarse prior ``Dir(alpha 1)`` and, for each coarse class ``c``, a fine prior
    ``Dir(beta 1)`` over the fine labels of ``c``. Each of its ``samples_per_client`` (default
    ``N // num_clients``) samples picks a coarse class, then a fine label, then a sample, without
    replacement; exhausted fine labels and coarse classes are removed and the priors renormalised.
    Every fine label must belong to exactly one coarse class.
    """
    coarse = _check_labels(coarse_labels, "coarse_labels")
    fine = _check_labels(fine_labels, "fine_labels")
    if len(coarse) != len(fine):
        raise ValueError(f"coarse_labels and fine_labels must have the same length, got {len(coarse)} "
                         f"and {len(fine)}")
    num_clients = _check_count("num_clients", num_clients, 1, len(fine))
    alpha = _check_concentration("alpha", alpha)
    beta = _check_concentration("beta", beta)
    rng = _check_rng(rng)
    per_client = _samples_per_client(samples_per_client, len(fine), num_clients)
    fine_classes = np.unique(fine)
    pairs = np.unique(np.stack([fine, coarse], axis=1), axis=0)
    if len(pairs) != len(fine_classes):
        raise ValueError("fine_labels must each belong to exactly one coarse label, but some fine label "
                         "appears under several coarse_labels")
    coarse_classes = np.unique(coarse)
    # fine classes of each coarse class, as positions into fine_classes
    members = [np.flatnonzero(pairs[:, 1] == c) for c in coarse_classes]
    pools = _class_pools(fine, fine_classes, rng)
    remaining = np.array([len(pool) for pool in pools], dtype=np.int64)
    used = np.zeros(len(fine_classes), dtype=np.int64)
    parts = []
    for _ in range(num_clients):
        coarse_prior = rng.dirichlet(np.full(len(coarse_classes), alpha))
        fine_priors = [rng.dirichlet(np.full(len(m), beta)) for m in members]
        counts = np.zeros(len(fine_classes), dtype=np.int64)
        need = per_client
        while need > 0:
            coarse_left = np.array([remaining[m].sum() for m in members])
            coarse_counts = rng.multinomial(need, _renormalised(coarse_prior, coarse_left))
            for position in np.flatnonzero(coarse_counts):
                m = members[position]
                got = _draw_counts(fine_priors[position], remaining[m],
                                   int(min(coarse_counts[position], coarse_left[position])), rng)
                counts[m] += got
                remaining[m] -= got
                need -= int(got.sum())
        parts.append(np.concatenate([pools[f][used[f]:used[f] + counts[f]] for f in range(len(fine_classes))]))
        used += counts
    return _sorted_parts(parts)


def natural(groups: Any, max_clients: int | None = None) -> list[np.ndarray]:
    """One client per distinct group id, in ascending id order (LEAF's natural split: a FEMNIST writer,
    a Shakespeare role). ``max_clients`` keeps the first ``max_clients`` groups."""
    groups = _check_labels(groups, "groups")
    ids = np.unique(groups)
    if max_clients is not None:
        max_clients = _check_count("max_clients", max_clients, 1)
        ids = ids[:max_clients]
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.searchsorted(sorted_groups, ids, side="left")
    ends = np.searchsorted(sorted_groups, ids, side="right")
    return _sorted_parts([order[s:e] for s, e in zip(starts, ends)])


def local_test_split(parts: list[np.ndarray], fraction: float, rng: np.random.Generator,
                     ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Hold out ``fraction`` of every client's samples as its local test set (FedP3 §5: a 70/30 split is
    ``fraction=0.3``): ``(train_parts, test_parts)``, both sorted.

    A client with ``n`` samples keeps ``round(n · fraction)`` for testing, at most ``n − 1`` (it always keeps
    one training sample); the held-out samples are drawn uniformly without replacement from ``rng``.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be a number in [0, 1), got {fraction!r}")
    train, test = [], []
    for idx in parts:
        idx = np.asarray(idx, dtype=np.int64)
        n_test = min(int(round(len(idx) * fraction)), max(0, len(idx) - 1))
        perm = rng.permutation(len(idx))
        test.append(np.sort(idx[perm[:n_test]]))
        train.append(np.sort(idx[perm[n_test:]]))
    return train, test


def make_partition(name: str, labels: Any, num_clients: int, rng: np.random.Generator, *,
                   alpha: float | None = None, k: int | None = None, groups: Any = None,
                   coarse_labels: Any = None, beta: float | None = None,
                   samples_per_client: int | None = None, client_groups: Any = None) -> list[np.ndarray]:
    """Dispatch to a partitioner by name (one of :data:`PARTITIONS`).

    ``"dirichlet"`` is :func:`dirichlet_equal`. Needed arguments: ``alpha`` for the Dirichlet ones and
    ``pachinko`` (which also needs ``beta`` and ``coarse_labels``; ``labels`` are the fine labels), ``k``
    for ``k_classes``, ``groups`` for ``natural`` (whose ``num_clients`` caps the number of groups used),
    ``client_groups`` (one group label per client, ``num_clients`` of them) for ``dirichlet_groups``.
    """
    if name not in PARTITIONS:
        raise ValueError(f"name must be one of {PARTITIONS}, got {name!r}")
    if name == "dirichlet_groups":
        if client_groups is None or len(client_groups) != num_clients:
            raise ValueError(f"client_groups (one group label per client, {num_clients} of them) is required for "
                             f"the 'dirichlet_groups' partition, got {client_groups!r}")
        return dirichlet_groups(labels, client_groups, alpha, rng)
    if name == "natural":
        if groups is None:
            raise ValueError("groups is required for the 'natural' partition (one client per group), got None")
        return natural(groups, max_clients=num_clients)
    if name == "iid":
        return iid(labels, num_clients, rng)
    if name == "k_classes":
        if k is None:
            raise ValueError("k is required for the 'k_classes' partition (classes per client), got None")
        return k_classes(labels, num_clients, k, rng)
    alpha = _check_concentration("alpha", alpha)
    if name == "dirichlet":
        return dirichlet_equal(labels, num_clients, alpha, rng, samples_per_client)
    if name == "dirichlet_prior":
        return dirichlet_prior(labels, num_clients, alpha, rng, samples_per_client)
    if name == "dirichlet_allocation":
        return dirichlet_allocation(labels, num_clients, alpha, rng)
    if coarse_labels is None:
        raise ValueError("coarse_labels is required for the 'pachinko' partition, got None")
    beta = _check_concentration("beta", beta)
    return pachinko(coarse_labels, labels, num_clients, alpha, beta, rng, samples_per_client)


def label_histogram(labels: Any, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Counts of each label per client: an int64 array of shape ``(len(parts), num_classes)``."""
    labels = _check_labels(labels)
    num_classes = _check_count("num_classes", num_classes, int(labels.max()) + 1)
    histogram = np.zeros((len(parts), num_classes), dtype=np.int64)
    for row, part in enumerate(parts):
        histogram[row] = np.bincount(labels[np.asarray(part, dtype=np.int64)], minlength=num_classes)
    return histogram
