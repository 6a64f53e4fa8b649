"""Every configuration the book builds: the catalog's functions over the grids its pages use, the configurations the
notebooks build themselves (transcribed from their code cells), and every configuration recorded in the run store and
in the executed pages' metadata. ``tests/experiments/test_book_configs.py`` passes each through the config validation.

When a notebook or the catalog gains a new grid, add it here: a book configuration the validation refuses would break
its page.
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from subfl.experiments import ExperimentConfig, make_config

ROOT = Path(__file__).resolve().parents[2]


def _catalog(scale: str) -> Iterator[tuple[str, ExperimentConfig]]:
    from subfl_book import catalog as c

    # chapter "The federated setting" (fedavg.ipynb; alpha is the page's parameter, 0.1 by default)
    for dataset in ("fmnist", "cifar10"):
        for partition, alpha in (("iid", None), ("dirichlet", 0.1), ("dirichlet", 1.0)):
            yield f"fedavg_reference({dataset}, {partition}, {alpha})", c.fedavg_reference(
                dataset, partition, alpha, scale=scale)

    # FLANC (capacity, communication, composition, datasets)
    for dataset, splits in c._FLANC_DATASET_SPLITS.items():
        for partition in splits:
            yield f"flanc fedavg full {dataset} {partition}", c.flanc_config("fedavg", "full", partition,
                                                                             dataset=dataset, scale=scale)
            for setting in c.FLANC_SETTINGS:
                for method in c.FLANC_METHODS:
                    yield f"flanc {method} {setting} {dataset} {partition}", c.flanc_config(
                        method, setting, partition, dataset=dataset, scale=scale)
            yield "flanc heterofl scaler", c.flanc_config("heterofl", "static", partition, dataset=dataset,
                                                          scale=scale, scaler=True)
    for method in c.FLANC_METHODS:
        yield f"flanc {method} shakespeare lr 0.5", c.flanc_config(method, "static", "roles", dataset="shakespeare",
                                                                    scale=scale, lr=0.5)
    for options in ({"ortho_lambda": 0.0}, {"r1_fraction": 0.0625}, {"r1_fraction": 0.25}, {"r2_fraction": 0.5},
                    {"r2_fraction": 0.75}):
        yield f"flanc composition {options}", c.flanc_config("flanc", "static", "iid", scale=scale, **options)

    # CAFF (finetuning, constraints, heterogeneous, selection, cifar10)
    yield from ((f"caff fig1 {i}", cfg) for i, cfg in enumerate(c.caff_fig1_configs(scale=scale)))
    for task in c.CAFF_TASKS:
        for layers in c.caff_fig1_depths(scale):
            for trained in sorted({1, layers}):
                cfg = c.caff_task_config(task, layers, scale=scale, trained_layers=trained)
                yield f"caff task {task} F_{layers}^{trained}", cfg
                yield f"caff task {task} F_{layers}^{trained} table 2 mix", cfg.replace(
                    heterogeneity=c.CAFF_TABLE2_HETEROGENEITY)
        # every cell the plans can choose (the plans measure models: minutes at the cpu scale), a superset of
        # caff_table1_configs / caff_table2_configs / caff_fig3_configs
        if scale not in c.CAFF_TABLE1_LEVELS:  # the tables are defined at ci and cpu only
            continue
        for constraint, levels in c.caff_table1_levels(scale, task).items():
            for level in levels:
                for method in c.CAFF_TABLE1_METHODS:
                    for layers in c.caff_fig1_depths(scale):
                        yield f"caff table1 {task} {constraint} {level} {method} F_{layers}", c.caff_table1_config(
                            method, constraint, level, layers, scale=scale, task=task)
        for constraint in c.caff_table2_budgets(scale, task):
            for method in c.CAFF_TABLE2_METHODS:
                for layers in c.caff_fig1_depths(scale):
                    yield f"caff table2 {task} {constraint} {method} F_{layers}", c.caff_table2_config(
                        method, constraint, layers, scale=scale, task=task)
    for share in c.CAFF_FIG3_WEAK_SHARES if scale in c.CAFF_FIG3_BUDGETS else ():
        for layers in c.caff_fig1_depths(scale):
            yield f"caff fig3 {share} F_{layers}", c.caff_fig3_config(share, layers, scale=scale)

    # spectral sharding and PriSM (training, keep_ratios, heterogeneous, trainable_sigma, memory_efficient, ...)
    spectral_methods = (*c.SPECTRAL_METHODS, "unbiased", "collective", "schatten+cliplr", "prism+scaled", "topn+scaled",
                        "prism+sigma", "prism+memory", "nosharding")
    for keep in c.SPECTRAL_KEEP:
        for method in spectral_methods:
            for lr in (None, c.SPECTRAL_LOW_LR, 0.0025):
                yield f"spectral {method} {keep} lr {lr}", c.spectral_config(method, keep, scale=scale, lr=lr)
        yield f"spectral splitmix {keep} atoms 10", c.spectral_config("splitmix", keep, scale=scale,
                                                                      lr=c.SPECTRAL_LOW_LR, atoms=10)
        for q in (None, 0.4):
            for rows in ("leading", "random"):
                options = ({} if q is None else {"output_keep": q}) | ({} if rows == "leading" else
                                                                       {"output_rows": rows})
                yield f"prism+memory {keep} {options}", c.spectral_config(
                    "prism+memory", keep, "dirichlet", 0.1, scale=scale, lr=c.SPECTRAL_LOW_LR, **options)
        yield f"prism+narrow {keep}", c.spectral_config("prism+narrow", keep, "dirichlet", 0.1, scale=scale,
                                                        lr=c.SPECTRAL_LOW_LR)
        for method in c.SPECTRAL_FIG4_METHODS:
            yield f"spectral probe {method} {keep}", c.spectral_probe_config(method, keep, scale=scale)
    if scale in c.SPECTRAL_RESNET_SIZE:
        for method in c.SPECTRAL_RESNET_METHODS:
            yield f"spectral resnet {method}", c.spectral_resnet_config(method, scale=scale)
    for split, methods in c.SPECTRAL_HETEROGENEITY.items():
        for method in methods:
            cfg = c.spectral_heterogeneity_config(method, split, scale=scale)
            yield f"spectral heterogeneity {method} {split}", cfg
            if split == "0.1":  # prism/epochs_clients.ipynb: local epochs (rounds x epochs fixed) and active clients
                total = cfg.rounds * cfg.local_epochs
                for change in ([{"local_epochs": e, "rounds": total // e} for e in (1, 2, 4) if total % e == 0]
                               + [{"clients_per_round": round(s * cfg.num_clients)} for s in (0.25, 0.5, 1.0)]):
                    yield f"epochs_clients {method} {change}", cfg.replace(**change)
    # prism/heterogeneous.ipynb: Table 3's i.i.d and alpha = 1 rows of the mixed keep ratios
    for split in ("iid", "1"):
        for method in ("fedavg", "origdrop", "topn", "prism"):
            yield f"heterogeneous table 3 {method} {split}", c.spectral_config(
                method, "mixed", *c.label_split(split), scale=scale, lr=c.SPECTRAL_LOW_LR)
    # spectral/keep_ratios.ipynb: Fig. 2's designs also scored on training images
    for method in ("unbiased+cliplr", "collective+cliplr"):
        yield f"keep ratios fig 2 {method}", c.spectral_config(method, "r0.1", scale=scale, lr=c.SPECTRAL_LOW_LR
                                                               ).replace(train_eval_samples=100 if scale == "ci" else 2000)
    for method in c.PRISM_FACTOR_DECAY_METHODS:
        for decay in ("weight", "frobenius"):
            yield f"factor decay {method} {decay}", c.prism_factor_decay_config(method, decay, scale=scale)
    for table in c.SPECTRAL_ABLATIONS:
        yield from ((f"ablation {table} {i}", cfg) for i, cfg in enumerate(c.spectral_ablation_configs(
            table, scale=scale)))
    for split in ("iid", "1"):  # spectral/ablations.ipynb: PriSM Table 5's other columns
        yield from ((f"ablation prism table 5 {split} {i}", cfg) for i, cfg in enumerate(c.spectral_ablation_configs(
            "PriSM's sampling distribution (PriSM Table 5)", scale=scale, split=split)))

    # FedP3 (layers, datasets, pruning, aggregation, privacy, blocks)
    for dataset in c.FEDP3_MODELS:
        for split in c.FEDP3_SPLITS:
            for method in (*c.FEDP3_FIG2_METHODS, *c.FEDP3_FIG5_METHODS):
                cfg = c.fedp3_config(method, split, dataset=dataset, scale=scale)
                yield f"fedp3 {method} {split} {dataset}", cfg
                for width in (0.25, 0.5, 1.0):
                    yield f"fedp3 {method} {split} {dataset} width {width}", cfg.replace(width=width)
        yield f"fedp3 lowerb lr 0.01 {dataset}", c.fedp3_config("lowerb", "S1", dataset=dataset, scale=scale, lr=0.01)
        for split in ("S1", "S2"):
            for kind in ("global", "local", "aggregation", "ldp"):
                yield from ((f"fedp3 ablation {kind} {split} {dataset} {i}", cfg) for i, cfg in enumerate(
                    c.fedp3_ablation_configs(kind, split, dataset=dataset, scale=scale)))
    for split in c.FEDP3_SPLITS:
        for row in c.FEDP3_BLOCK_ROWS:
            yield f"fedp3 block {row} {split}", c.fedp3_block_config(row, split, scale=scale)
        yield f"fedp3 block fedavg {split}", c.fedp3_block_config("", split, scale=scale, method="fedavg")


def _other_modules(scale: str) -> Iterator[tuple[str, ExperimentConfig]]:
    from subfl_book.centralised import centralised_configs
    from subfl_book.imdb import imdb_config
    from subfl_book.spectral_shakespeare import spectral_shakespeare_config

    yield from ((f"centralised {i}", cfg) for i, cfg in enumerate(centralised_configs(scale=scale)))
    for method in ("fedavg", "topn", "prism", "origdrop", "splitmix"):
        yield f"imdb {method}", imdb_config(method, "0.2", scale=scale)
        yield f"imdb {method} non-iid", imdb_config(method, "0.2", partition="dirichlet", alpha=0.1, scale=scale)
    for method in ("fedavg", "topn", "prism", "unbiased", "collective", "nosharding"):
        for keep in ("0.2", "0.1", "0.2:0.6,0.4:0.4"):
            cfg = spectral_shakespeare_config(method, keep, scale=scale)
            yield f"spectral shakespeare {method} {keep}", cfg
            yield f"spectral shakespeare {method} {keep} longer", spectral_shakespeare_config(
                method, keep, scale=scale, rounds=2 * cfg.rounds)


def _notebooks(scale: str) -> Iterator[tuple[str, ExperimentConfig]]:
    # prism/femnist.ipynb and prism/longer_training.ipynb
    setting = make_config("fedavg", "femnist", partition="natural", model="cnn", scale=scale)
    yield "femnist fedavg", setting
    yield "femnist fedavg longer", setting.replace(rounds=round(2.5 * setting.rounds))
    atoms = {"0.1": 10, "0.2": 5, "0.4": 5}
    for keep in atoms:
        for method in ("topn", "prism", "origdrop", "splitmix", "unbiased+cliplr", "collective+cliplr"):
            options = {"atoms": atoms[keep]} if method == "splitmix" else {}
            for rounds in ({}, {"rounds": round(2.5 * setting.rounds)}):
                yield f"femnist {method} {keep} {rounds}", make_config(
                    method, "femnist", partition="natural", model="cnn", scale=scale, heterogeneity=keep,
                    method_options=options, **rounds)
    # fedp3/communication.ipynb
    small = {"ci": {}, "cpu": dict(num_clients=20, clients_per_round=8, local_epochs=1, max_train_samples=6000,
                                   max_test_samples=1000), "paper": dict(clients_per_round=10)}[scale]
    for variant in ("lowerb", "opu2", "opu3"):
        for keep in (1.0, 0.9, 0.7, 0.5):
            cfg = make_config(variant, "fmnist", "fedp3_cnn", scale=scale, rounds=4, width=1.0,
                              method_options={"global_keep": keep}, **small)
            yield f"fedp3 communication {variant} P={keep}", cfg
            yield f"fedp3 communication {variant} P={keep} 1 round", cfg.replace(rounds=1)


def recorded_configs() -> Iterator[tuple[str, dict]]:
    """The configuration (as its JSON) of every run in ``store/`` and of every run an executed page in ``book/``
    recorded reading."""
    for path in sorted((ROOT / "store").glob("*/*.json.gz")):
        try:
            record = json.loads(gzip.decompress(path.read_bytes()))
        except (OSError, ValueError):  # a record being written by a page executing now
            continue
        yield f"store {path.name[:12]}", record["config"]
    for path in sorted((ROOT / "book").rglob("*.ipynb")):
        try:
            meta = json.loads(path.read_text()).get("metadata", {})
        except (OSError, ValueError):
            continue
        for value in meta.values():
            if isinstance(value, dict) and isinstance(value.get("runs"), list):
                for run in value["runs"]:
                    if isinstance(run, dict) and "config" in run:
                        yield f"{path.relative_to(ROOT)} {run.get('key', '')[:12]}", run["config"]


def book_configs(scale: str) -> Iterator[tuple[str, ExperimentConfig]]:
    """``(label, config)`` of every configuration the catalog and the notebooks build at ``scale``."""
    yield from _catalog(scale)
    yield from _other_modules(scale)
    yield from _notebooks(scale)
