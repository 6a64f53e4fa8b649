"""The design appendix's table of methods (``book/appendix/design.md``), generated from the library's registry
(:data:`subfl.methods.METHODS`): every registered name, grouped by the module that implements it, with what it
implements and the papers it follows (:data:`ROWS`). ``subfl-book --scorecard`` rewrites the table, and a test fails
when the committed table differs — a method registered without a row cannot be published."""
from __future__ import annotations

from pathlib import Path

from subfl.methods import METHODS

MARKERS = ("<!-- methods-table:start -->", "<!-- methods-table:end -->")

ROWS: dict[str, tuple[str, str]] = {
    "subfl.methods.fedavg": ("the full model on every client, averaged by data size",
                             "{cite:t}`mcmahan2017fedavg` (every chapter's reference)"),
    "subfl.methods.width": ("width slicing: a client trains a slice of every layer (static, ordered-dropout or "
                            "rolling channels)",
                            "{cite:t}`diao2021heterofl`; {cite:t}`horvath2021fjord`; {cite:t}`alam2022fedrolex`"),
    "subfl.methods.origdrop": ("the leading channels of every hidden layer, in the original space",
                               "OrigDrop, a baseline of {cite:t}`niu2023prism`"),
    "subfl.methods.splitmix": ("K narrow atoms trained from their own initialisations, evaluated as an ensemble",
                               "{cite:t}`hong2022splitmix`, a baseline of {cite:t}`niu2023prism`"),
    "subfl.methods.spectral": ("SVD terms of every decomposed layer: top-n, PriSM's "
                               "$p \\propto \\lambda^\\kappa$, Wallenius, the "
                               "Unbiased and Collective designs, Schatten norms, the clipped learning rate",
                               "{cite:t}`niu2023prism`; {cite:t}`korzhenkov2024spectral`"),
    "subfl.methods.prism_memory": ("PriSM's terms, and only some output rows of each decomposed layer (leading or "
                                   "random)", "{cite:t}`niu2023prism`, Sec. 3.2.1 and Eq. 5"),
    "subfl.methods.prism_narrow": ("every layer keeps its leading ⌈r·K⌉ channels, so the next layer sees r inputs",
                                   "{cite:t}`niu2023prism`, Sec. 3.2.1 and Table 1"),
    "subfl.methods.prism_sigma": ("PriSM with σ trained as a parameter of its own and merged before upload",
                                  "{cite:t}`niu2023prism`, Sec. 3.2.2"),
    "subfl.methods.flanc": ("a width-p network composed from one shared neural basis and per-width coefficients",
                            "{cite:t}`mei2022flanc`"),
    "subfl.methods.fedp3": ("a subset of the layers of a pruned global model, with local pruning, three "
                            "aggregation rules and LDP", "{cite:t}`yi2024fedp3`"),
    "subfl.methods.fedp3_blocks": ("layer-subset training of ResNet-18 with some blocks never assigned",
                                   "{cite:t}`yi2024fedp3`, the ResNet-18 block ablation"),
    "subfl.methods.caff": ("the last t layers of a pretrained model chosen for every device's budgets (Eqs. 2–5)",
                           "{cite:t}`pfeiffer2024caff`"),
    "subfl.methods.hetlora": ("LoRA finetuning with a device-dependent rank",
                              "{cite:t}`cho2024hetlora`, a baseline of {cite:t}`pfeiffer2024caff`"),
    "subfl.methods.fedhm": ("low-rank factorised finetuning with a device-dependent rank",
                            "{cite:t}`yao2021fedhm`, a baseline of {cite:t}`pfeiffer2024caff`"),
    "subfl.methods.depthfl": ("depth-wise finetuning with early exits",
                              "{cite:t}`kim2023depthfl`, a baseline of {cite:t}`pfeiffer2024caff`"),
    "subfl.methods.width_finetuning": ("width slicing applied to finetuning a pretrained model",
                                       "HeteroFL, FjORD and FedRolex as baselines of {cite:t}`pfeiffer2024caff`"),
    "subfl.methods.update_probe": ("any spectral strategy, recording the cosine of its server update to FedAvg's",
                                   "{cite:t}`korzhenkov2024spectral`, Fig. 4"),
}
"""What each method module implements and the papers it follows (citations of ``book/references.bib``)."""


def methods_block() -> str:
    """The table between :data:`MARKERS`: one row per module of :data:`~subfl.methods.METHODS`, in registry order,
    every registered name in it."""
    by_module: dict[str, list[str]] = {}
    for name, cls in METHODS.items():
        by_module.setdefault(cls.__module__, []).append(name)
    missing = sorted(set(by_module) - set(ROWS))
    if missing:
        raise ValueError(f"no row for the method module(s) {', '.join(missing)}: add them to "
                         "subfl_book.design_page.ROWS")
    lines = ["| method(s) | `subfl.methods.` | what it is | paper |", "|---|---|---|---|"]
    for module, names in by_module.items():
        what, paper = ROWS[module]
        lines.append(f"| {', '.join(f'`{n}`' for n in names)} | `{module.removeprefix('subfl.methods.')}` | {what} "
                     f"| {paper} |")
    return f"{MARKERS[0]}\n" + "\n".join(lines) + f"\n{MARKERS[1]}"


def design_path(root: Path) -> Path:
    return root / "book" / "appendix" / "design.md"
