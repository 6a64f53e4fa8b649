"""CAFF Table 1's plan: which configuration every method trains under a homogeneous budget (catalog)."""
import pandas as pd
import pytest

from subfl_book import catalog


def _tables():
    # two depths; CAFF's F_l^t, HetLoRA's ranks and FedHM's ratios with hand-made costs (memory only varies)
    caff = pd.DataFrame([{"layers": l, "scheme": "freeze", "trained": t, "memory_mb": m, "upload_mb": 1.0,
                          "gflops": 1.0} for l, t, m in [(2, 1, 10), (2, 2, 20), (4, 1, 12), (4, 2, 22), (4, 3, 32),
                                                          (4, 4, 42)]])
    lora = pd.DataFrame([{"layers": l, "scheme": "lora", "trained": l, "rank": r, "memory_mb": m, "upload_mb": 0.5,
                          "gflops": 1.0} for l, r, m in [(2, 3, 18), (2, 24, 19), (4, 3, 36), (4, 24, 38)]])
    fedhm = pd.DataFrame([{"layers": l, "rank_ratio": q, "memory_mb": m, "upload_mb": 1.0, "gflops": 1.0}
                          for l, q, m in [(2, 1.0, 21), (2, 0.5, 15), (4, 1.0, 41), (4, 0.5, 31)]])
    width = pd.DataFrame([{"layers": l, "width": w, "memory_mb": m, "upload_mb": 1.0, "gflops": 1.0}
                          for l, w, m in [(2, 0.5, 8), (2, 1.0, 25), (4, 0.5, 14), (4, 1.0, 45)]])
    depthfl = pd.DataFrame([{"layers": l, "depth": d, "memory_mb": m, "upload_mb": 1.0, "gflops": 1.0}
                            for l, d, m in [(2, 1, 11), (2, 2, 21), (4, 1, 11), (4, 2, 21), (4, 3, 31), (4, 4, 41)]])
    return {"caff": caff, "hetlora": lora, "fedhm": fedhm, "width": width, "depthfl": depthfl}


def test_caff_table1_plan_on_hand_made_costs(monkeypatch):
    monkeypatch.setitem(catalog._CAFF_TABLE1_TABLES, ("ci", "shakespeare"), _tables())
    monkeypatch.setitem(catalog.CAFF_TABLE1_LEVELS, "ci", {"memory_mb": (7.0, 12.0, 33.0, 40.0)})
    monkeypatch.setattr(catalog, "caff_fig1_depths", lambda scale="cpu": (2, 4))
    plan = catalog.caff_table1_plan("ci").set_index(["level", "method"])
    # 7 MB: nothing fits anywhere
    assert list(plan.loc[7.0].mark) == ["—", "—", "—", "—"]
    # 12 MB: t = 1 on both depths, the tie goes to the deeper model; no baseline fits at all
    assert (plan.loc[(12.0, "caff"), "layers"], plan.loc[(12.0, "caff"), "setting"]) == (4, 1)
    assert plan.loc[(12.0, "hetlora"), "mark"] == plan.loc[(12.0, "fedhm"), "mark"] == "—"
    # ... but the half-width slice of F_2 does (8 MB), and not F_4's (14 MB): a shallower model, marked †
    assert (plan.loc[(12.0, "fedrolex-ft"), "layers"], plan.loc[(12.0, "fedrolex-ft"), "setting"],
            plan.loc[(12.0, "fedrolex-ft"), "mark"]) == (2, 0.5, "†")
    # 33 MB: F_4^3 (3 blocks) beats F_2^2; on F_4 LoRA needs 36 MB, so it falls back to F_2 (†) at its largest rank;
    # FedHM fits F_4 at ratio 0.5 (31 MB) and stays on CAFF's model
    assert (plan.loc[(33.0, "caff"), "layers"], plan.loc[(33.0, "caff"), "setting"]) == (4, 3)
    assert (plan.loc[(33.0, "hetlora"), "layers"], plan.loc[(33.0, "hetlora"), "setting"],
            plan.loc[(33.0, "hetlora"), "mark"]) == (2, 24, "†")
    assert (plan.loc[(33.0, "fedhm"), "layers"], plan.loc[(33.0, "fedhm"), "setting"],
            plan.loc[(33.0, "fedhm"), "mark"]) == (4, 0.5, "")
    # 40 MB: LoRA rank 24 on F_4 (38 MB) now fits CAFF's model
    assert (plan.loc[(40.0, "hetlora"), "layers"], plan.loc[(40.0, "hetlora"), "setting"],
            plan.loc[(40.0, "hetlora"), "mark"]) == (4, 24, "")


def test_caff_table1_config_budgets_every_device():
    cfg = catalog.caff_table1_config("hetlora", "upload_mb", 2.2, 3, scale="ci", seed=1)
    options = dict(cfg.method_options)
    assert options["budgets"] == {"1": {"upload_mb": 2.2}} and options["architecture"] == 3
    assert options["ranks"] == catalog.CAFF_TABLE1_LORA_RANKS and cfg.seed == 1 and cfg.heterogeneity == "1.0"
    caff = dict(catalog.caff_table1_config("caff", "gflops", 5.0, 3, scale="ci").method_options)
    assert caff["layers"] == (3,) and "architecture" not in caff  # CAFF chooses among the pretrained depths
    rolex = dict(catalog.caff_table1_config("fedrolex-ft", "gflops", 5.0, 3, scale="ci").method_options)
    assert rolex["widths"] == catalog.CAFF_WIDTHS and rolex["architecture"] == 3
    with pytest.raises(ValueError, match="method='fedrolex'"):
        catalog.caff_table1_config("fedrolex", "gflops", 5.0, 3)
    with pytest.raises(ValueError, match="constraint='energy'"):
        catalog.caff_table1_config("caff", "energy", 5.0, 3)


def test_caff_fig3_plan_follows_eq3_as_the_mix_changes(monkeypatch):
    # costs: F_2^t 1/3 GFLOPs, F_4^t 1.5/2/5/6 GFLOPs; weak devices have 2, strong 6
    table = pd.DataFrame([{"layers": l, "scheme": "freeze", "trained": t, "memory_mb": 1.0, "upload_mb": 1.0,
                           "gflops": g} for l, t, g in [(2, 1, 1), (2, 2, 3), (4, 1, 1.5), (4, 2, 2), (4, 3, 5),
                                                        (4, 4, 6)]])
    monkeypatch.setitem(catalog._CAFF_TABLE1_TABLES, ("ci", "shakespeare"), {"caff": table})
    monkeypatch.setitem(catalog.CAFF_FIG3_BUDGETS, "ci", (2.0, 6.0))
    monkeypatch.setattr(catalog, "caff_fig1_depths", lambda scale="cpu": (2, 4))
    plan = catalog.caff_fig3_plan("ci").set_index(["weak_share", "layers"])
    # weak: t = 1 on F_2, 2 on F_4; strong: 2 on F_2, 4 on F_4 -> F_4 has the larger mean at every mix
    assert plan.loc[(0.5, 4), "mean_trained"] == 3.0 and plan.loc[(0.5, 2), "mean_trained"] == 1.5
    assert plan.loc[(0.0, 4), "selected"] and plan.loc[(1.0, 4), "selected"] and not plan.loc[(1.0, 2), "selected"]
    assert (plan.loc[(0.25, 4), "t_weak"], plan.loc[(0.25, 4), "t_strong"]) == (2, 4)
    cfg = catalog.caff_fig3_config(0.25, 4, scale="ci")
    assert cfg.heterogeneity == "0.5:0.25,1.0:0.75" and dict(cfg.method_options)["architecture"] == 4
    assert dict(cfg.method_options)["budgets"] == {"0.5": {"gflops": 2.0}, "1": {"gflops": 6.0}}
    with pytest.raises(ValueError, match="weak_share=0.3"):
        catalog.caff_fig3_config(0.3, 4, scale="ci")


def test_caff_table2_plan_needs_both_groups_to_fit(monkeypatch):
    monkeypatch.setitem(catalog._CAFF_TABLE1_TABLES, ("ci", "shakespeare"), _tables())
    monkeypatch.setitem(catalog.CAFF_TABLE2_BUDGETS["shakespeare"], "ci", {"memory_mb": (12.0, 33.0)})
    monkeypatch.setattr(catalog, "caff_fig1_depths", lambda scale="cpu": (2, 4))
    plan = catalog.caff_table2_plan("ci").set_index("method")
    # CAFF: weak t = 1, strong t = 3 on F_4 (mean 2) beats F_2 (1 and 2: mean 1.5)
    assert (plan.loc["caff", "layers"], plan.loc["caff", "weak"], plan.loc["caff", "strong"]) == (4, 1, 3)
    # DepthFL fits depth 1 at 12 MB and depth 3 at 33 MB on CAFF's F_4
    assert (plan.loc["depthfl", "layers"], plan.loc["depthfl", "weak"], plan.loc["depthfl", "strong"],
            plan.loc["depthfl", "mark"]) == (4, 1, 3, "")
    # width: the weak group fits only F_2's half width (8 MB) -> everyone on F_2 (†), strong at full width (25 MB)
    assert (plan.loc["fjord-ft", "layers"], plan.loc["fjord-ft", "weak"], plan.loc["fjord-ft", "strong"],
            plan.loc["fjord-ft", "mark"]) == (2, 0.5, 1.0, "†")
    # LoRA and FedHM: nothing fits the weak devices anywhere
    assert plan.loc["hetlora", "mark"] == plan.loc["fedhm", "mark"] == "—"
    cfg = catalog.caff_table2_config("caff", "memory_mb", 4, scale="ci")
    options = dict(cfg.method_options)
    assert cfg.heterogeneity == catalog.CAFF_TABLE2_HETEROGENEITY and options["architecture"] == 4
    assert options["budgets"] == {"0.5": {"memory_mb": 12.0}, "1": {"memory_mb": 33.0}}
    with pytest.raises(ValueError, match="constraint='gflops' has no Table 2 budgets"):
        catalog.caff_table2_config("caff", "gflops", 4, scale="ci")
    with pytest.raises(ValueError, match="task='cifar100'"):
        catalog.caff_task_config("cifar100", 3, scale="ci")


def test_task_config_trained_layers_is_the_reference_when_every_block_trains():
    full = catalog.caff_task_config("cifar10", 3, scale="ci", trained_layers=3)
    assert dict(full.method_options)["trained_layers"] == 3 and dict(full.method_options)["architecture"] == 3
    # the default is the old one-block setting; Shakespeare forwards the keyword to Fig. 1's config
    assert dict(catalog.caff_task_config("cifar10", 3, scale="ci").method_options)["trained_layers"] == 1
    assert catalog.caff_task_config("shakespeare", 3, scale="ci", trained_layers=2) == \
        catalog.caff_fig1_config("layers", 3, 2, scale="ci")
    for bad in (0, 4, 2.0, True):
        with pytest.raises(ValueError, match=r"trained_layers=.* accepted: an int in 1\.\.3"):
            catalog.caff_task_config("cifar10", 3, scale="ci", trained_layers=bad)
