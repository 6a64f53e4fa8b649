"""The run store: records round-trip, reading needs no training, keys follow behaviour, the size budget holds."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from subfl.experiments import make_config, run_experiment as compute_run
from subfl.experiments.provenance import canonical_config, run_key
from subfl.files import write_bytes_atomically
from subfl_book import store

ROOT = Path(__file__).resolve().parents[2]
CONFIG = make_config("prism", "digits", scale="ci", rounds=2, max_train_samples=120, heterogeneity="0.5")


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBFL_STORE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("SUBFL_WORK_DIR", str(tmp_path / "work"))
    return tmp_path


def test_a_recorded_run_reads_back_identically_without_training(tmp_store, monkeypatch):
    first = store.run_experiment(CONFIG, keep_state=True)
    assert not [p for p in (tmp_store / "work").iterdir() if p.is_dir()]  # the run's work folder is removed
    direct = compute_run(CONFIG, tmp_store / "direct", cache=False)
    pd.testing.assert_frame_equal(first.history, direct.history)
    pd.testing.assert_frame_equal(first.ledger, direct.ledger)
    assert first.summary["upload_bytes"] == direct.summary["upload_bytes"] > 0
    record = json.loads(gzip.decompress(store.record_path(first.key).read_bytes()))
    assert record["versions"]["method:prism"] >= 1 and record["environment"]["threads"] == store.BOOK_THREADS
    assert record["canonical_config"] == canonical_config(CONFIG)

    monkeypatch.setattr(store, "compute_run", lambda *a, **k: pytest.fail("a stored run was recomputed"))
    again = store.run_experiment(CONFIG)
    pd.testing.assert_frame_equal(again.history, first.history)
    assert again.final() == first.final() and again.from_cache
    assert set(again.state()["weights"]) == set(direct.state()["weights"])


def test_weights_are_kept_only_when_asked(tmp_store):
    run = store.run_experiment(CONFIG)
    with pytest.raises(FileNotFoundError, match="keep_state=True"):
        run.state()
    assert not store.state_path(run.key).exists()


def test_the_key_ignores_defaults_and_scale_but_not_a_changed_field():
    same = CONFIG.replace(scale="cpu", lr_min=0.0)  # scale only names a preset; lr_min is at its default
    assert run_key(same) == run_key(CONFIG)
    assert run_key(CONFIG.replace(lr=0.2)) != run_key(CONFIG)
    assert run_key(CONFIG, {"torch": "2.14", "threads": 2, "device": "cpu"}) != \
        run_key(CONFIG, {"torch": "2.14", "threads": 1, "device": "cpu"})


def test_renaming_a_private_engine_helper_changes_no_key(tmp_path):
    """A behaviour-preserving refactor (a private helper renamed in fl/engine.py) leaves every key unchanged."""
    import shutil
    copy = tmp_path / "lib"
    shutil.copytree(ROOT / "lib" / "subfl", copy / "subfl", ignore=shutil.ignore_patterns("__pycache__"))
    engine = copy / "subfl" / "fl" / "engine.py"
    text = engine.read_text()
    assert "_save_checkpoint" in text
    engine.write_text(text.replace("_save_checkpoint", "_write_checkpoint_atomically"))
    code = ("from subfl.experiments import make_config, run_key; import subfl, sys; "
            "assert subfl.__file__.startswith(sys.argv[1]); "
            "print(run_key(make_config('prism', 'digits', scale='ci', rounds=2, max_train_samples=120, "
            "heterogeneity='0.5'), {'torch': 'x', 'threads': 1, 'device': 'cpu'}))")
    out = subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == run_key(CONFIG, {"torch": "x", "threads": 1, "device": "cpu"})


def test_the_committed_store_stays_within_its_size_budget():
    assert store.store_size_bytes(ROOT / "store") <= store.SIZE_BUDGET_MB * 1e6


def test_a_stored_run_answers_class_metrics_without_its_weights(tmp_store):
    from subfl_book.analysis import final_confusions, weak_device_f1_table

    config = make_config("fedavg", "digits", scale="ci", rounds=2, max_train_samples=200,
                         heterogeneity="0.5:0.5,1.0:0.5")
    stored = store.run_experiment(config)  # no weights kept
    direct = compute_run(config, tmp_store / "direct", cache=False)
    recorded, rebuilt = final_confusions(stored), final_confusions(direct)
    assert set(recorded) == set(rebuilt) == {"global"}
    from subfl.experiments import prepare_data
    assert (recorded["global"] == rebuilt["global"]).all()
    assert recorded["global"].sum() == len(prepare_data(config)[1])  # one entry per test sample
    accuracy = np.trace(recorded["global"]) / recorded["global"].sum()
    assert accuracy == pytest.approx(stored.final("accuracy"), abs=1e-12)  # the engine scored the same predictions
    pd.testing.assert_frame_equal(weak_device_f1_table([stored]), weak_device_f1_table([direct]))


def test_a_run_another_process_is_computing_is_waited_for_not_computed_twice(tmp_store, monkeypatch):
    import fcntl
    import threading

    key = store.book_key(CONFIG)
    lock = store.work_root() / f"{key[:24]}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # "another process" computes the run
        monkeypatch.setenv("SUBFL_LOCK_TIMEOUT_S", "0.3")
        with pytest.raises(TimeoutError, match="lock"):
            store.run_experiment(CONFIG)
        monkeypatch.setenv("SUBFL_LOCK_TIMEOUT_S", "60")
        finished = compute_run(CONFIG, tmp_store / "elsewhere", cache=False)

        def other_process_finishes():
            store.save_record(finished, key)
            fcntl.flock(held, fcntl.LOCK_UN)

        timer = threading.Timer(0.5, other_process_finishes)
        timer.start()
        monkeypatch.setattr(store, "compute_run", lambda *a, **k: pytest.fail("the run was computed twice"))
        waited = store.run_experiment(CONFIG)
        timer.join()
    pd.testing.assert_frame_equal(waited.history, finished.history)


def test_store_only_mode_refuses_to_compute_a_missing_run(monkeypatch):
    from subfl.experiments import make_config
    from subfl_book.store import STORE_ONLY_ENV, MissingRunError, run_experiment
    monkeypatch.setenv(STORE_ONLY_ENV, "1")
    with pytest.raises(MissingRunError, match="not in the store"):
        run_experiment(make_config("fedavg", "digits", scale="ci", rounds=1))


def test_ci_runs_never_go_into_the_repository_store(monkeypatch, tmp_path):
    from subfl.experiments import make_config
    from subfl_book.store import checkout_root, root_for
    monkeypatch.delenv("SUBFL_STORE_DIR", raising=False)
    monkeypatch.setenv("SUBFL_WORK_DIR", str(tmp_path))
    assert root_for(make_config("fedavg", "fmnist", scale="ci")) == tmp_path / "ci-store"
    assert root_for(make_config("fedavg", "fmnist", scale="cpu")) == checkout_root() / "store"


def _as_other_environment(run, environment: dict) -> str:
    """Re-file ``run``'s record as if it had been computed in ``environment`` (another machine's torch or device);
    returns the key it is filed under. The record's own key file is removed."""
    path = store.record_path(run.key)
    record = json.loads(gzip.decompress(path.read_bytes()))
    key = run_key(CONFIG, environment)
    record.update(key=key, environment=environment)
    record["summary"]["environment"] = environment
    write_bytes_atomically(store.record_path(key), gzip.compress(json.dumps(record).encode()))
    path.unlink()
    return key


GPU = {"torch": "2.11", "threads": 1, "device": "cuda"}


def test_a_run_of_another_environment_stands_in_for_the_same_experiment_only(tmp_store, monkeypatch):
    local = store.run_experiment(CONFIG)
    assert store.key_to_read(CONFIG) == local.key
    other = _as_other_environment(local, GPU)
    assert other != local.key and store.key_to_read(CONFIG) == other
    monkeypatch.setattr(store, "compute_run", lambda *a, **k: pytest.fail("a recorded experiment was recomputed"))
    read = store.run_experiment(CONFIG)
    assert read.key == other and read.summary["environment"]["device"] == "cuda"
    pd.testing.assert_frame_equal(read.history, local.history)
    # another experiment (one field changed) never stands in, nor does any run with its weights asked for
    assert store.key_to_read(CONFIG.replace(lr=CONFIG.lr * 2)) is None
    assert store.key_to_read(CONFIG, keep_state=True) is None
    assert store.key_to_read(CONFIG, same_environment=True) is None  # a page that reads timings asks for its own
    # asked to read only this environment's runs, the store has none
    monkeypatch.setenv(store.SAME_ENVIRONMENT_ENV, "1")
    monkeypatch.setenv(store.STORE_ONLY_ENV, "1")
    assert store.key_to_read(CONFIG) is None
    with pytest.raises(store.MissingRunError):
        store.run_experiment(CONFIG)


def test_the_run_of_this_environment_is_read_first_once_recorded(tmp_store, monkeypatch):
    local = store.run_experiment(CONFIG)
    history = local.history
    other = _as_other_environment(local, GPU)
    again = store.run_experiment(CONFIG)  # computes nothing: the GPU record stands in
    assert again.key == other
    monkeypatch.setenv(store.SAME_ENVIRONMENT_ENV, "1")
    recomputed = store.run_experiment(CONFIG)  # computes this environment's run
    monkeypatch.delenv(store.SAME_ENVIRONMENT_ENV)
    assert recomputed.key == local.key != other
    assert store.key_to_read(CONFIG) == local.key and store.same_experiment(CONFIG) == [local.key, other]
    pd.testing.assert_frame_equal(recomputed.history, history)


def test_the_experiment_key_ignores_the_device_but_follows_config_and_versions():
    canonical, versions = canonical_config(CONFIG), {"engine": 1, "method:prism": 3}
    key = store.experiment_key(canonical, versions)
    assert store.experiment_key({**canonical, "device": "cuda"}, versions) == key
    assert store.experiment_key({**canonical, "lr": 0.5}, versions) != key
    assert store.experiment_key(canonical, {**versions, "method:prism": 4}) != key


def test_a_record_names_the_hardware_it_was_computed_on(tmp_store):
    run = store.run_experiment(CONFIG)
    record = json.loads(gzip.decompress(store.record_path(run.key).read_bytes()))
    assert record["hardware"]["cpus"] >= 1 and "accelerator" not in record["hardware"]
    assert record["hardware"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["hardware"]["torch_build"] == torch.__version__
    assert {k: record["hardware"][k] for k in store.cpu_identity()} == store.cpu_identity()
    assert record["experiment_key"] == store.experiment_key(record["canonical_config"], record["versions"])


def test_the_cpu_is_named_from_cpuinfo_first_processor(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
                       "model name\t: Intel(R) Xeon(R) Platinum 8480+\n\nprocessor\t: 1\nvendor_id\t: Other\n")
    assert store.cpu_identity(cpuinfo) == {"cpu_vendor": "GenuineIntel", "cpu_family": "6", "cpu_model": "143",
                                           "cpu_name": "Intel(R) Xeon(R) Platinum 8480+"}
    assert store.cpu_identity(tmp_path / "absent") == {}


def test_history_difference_names_the_first_row_that_moved():
    base = [["round", [1, 1, 2]], ["metric", ["loss", "accuracy", "loss"]], ["value", [0.5, 0.25, 0.4]],
            ["group", ["global", "global", "global"]]]
    assert store.history_difference(base, json.loads(json.dumps(base))) is None
    moved = json.loads(json.dumps(base))
    moved[2][1][2] = 0.40000001
    assert store.history_difference(base, moved) == \
        "first at round 2, metric loss, group global: recorded 0.4, computed 0.40000001"
    assert "different shapes" in store.history_difference(base, [[c, v[:2]] for c, v in base])


def test_a_page_asking_for_weights_of_a_record_this_machine_does_not_reproduce_gets_an_error(tmp_store):
    """A record computed on a CPU that rounds differently (here: its round-1 loss moved by 1e-7) is not replaced
    by a page that now asks for the run's weights: the recomputation's history differs, so the page stops with an
    error naming the difference and the store is left as it was; ``replace_differing`` replaces the record (and
    drops the analyses computed from the other run's weights)."""
    run = store.run_experiment(CONFIG)
    path = store.record_path(run.key)
    record = json.loads(gzip.decompress(path.read_bytes()))
    values = dict(record["history"])["value"]
    values[0] += 1e-7
    record["analyses"] = {"made-up analysis": {"version": 1, "value": {"x": 1.0}}}
    path.write_bytes(gzip.compress(json.dumps(record).encode()))
    before = path.read_bytes()
    with pytest.raises(store.RecordDiffers, match=r"first at round 1.*replace_differing=True"):
        store.run_experiment(CONFIG, keep_state=True)
    assert path.read_bytes() == before and not store.state_path(run.key).exists()

    again = compute_run(CONFIG, tmp_store / "again", cache=False)
    store.save_record(again, run.key, keep_state=True, replace_differing=True)
    replaced = json.loads(gzip.decompress(path.read_bytes()))
    assert replaced["history"] == json.loads(json.dumps(store._frame_columns(again.history), default=str))
    assert replaced["history"] != record["history"]
    assert "made-up analysis" not in replaced["analyses"] and store.state_path(run.key).exists()


def test_analyses_come_from_the_kept_weights_and_the_weights_can_then_go(tmp_store, monkeypatch):
    """A run whose weights the store keeps gets an analysis from those weights — no recomputation — and, with
    drop_state, reads it afterwards from its record alone: here the singular values of PriSM's decomposed layers."""
    from subfl_book import final_analyses

    run = store.run_experiment(CONFIG, keep_state=True)
    factors = run.state()["factors"]
    digest = run.digest
    monkeypatch.setattr(store, "compute_run", lambda *a, **k: pytest.fail("the run was computed again"))
    store.record_analyses_from_state(CONFIG, run.key, [("final_spectra", {})], drop_state=True)
    assert not store.state_path(run.key).exists()
    again = store.run_experiment(CONFIG, analyses=[("final_spectra", {})])
    assert again.digest == digest   # the record of the same computation, with one more analysis
    spectra = final_analyses.spectra_from_value(final_analyses.final_analysis(again, "final_spectra"))
    assert set(spectra) == set(factors) and len(factors) >= 1
    for layer, f in factors.items():
        assert spectra[layer] == torch.as_tensor(f["singular_values"]).to(torch.float64).tolist()
    with pytest.raises(FileNotFoundError, match="keeps no weights"):
        store.record_analyses_from_state(CONFIG, run.key, [("final_spectra", {})])


def test_a_pretrained_model_is_recorded_once_and_read_back_without_pretraining(tmp_store, monkeypatch):
    """The store keeps the weights a page's pretrained models have; with the library's cache emptied and
    ``$SUBFL_STORE_ONLY`` set, they are read back bit for bit (and copied into the cache for runs), and a model
    the store lacks is an error instead of a pretraining."""
    import shutil

    import torch

    from subfl.artifacts import artifact_dir
    from subfl.data import default_data_root
    from subfl.pretraining import preset, pretrained_dir

    if not (default_data_root() / "english_corpus_pd.txt.gz").is_file():
        pytest.skip(f"the pretraining corpus is not in {default_data_root()} (set SUBFL_DATA_ROOT)")
    pytest.importorskip("sentencepiece")
    config = preset("lm", "ci", 1)
    first = store.pretrained(config, "ci")
    entry = store.pretrained_root("ci") / pretrained_dir(config).name
    assert entry.is_relative_to(tmp_store / "store")          # $SUBFL_STORE_DIR set: ci models go there too
    assert {p.name for p in entry.iterdir()} == {"weights.pt", "summary.json"}
    summary = store.pretraining_summary(config, "ci")
    assert summary["key"] == config.key() and len(summary["train_loss"]) == config.steps == 4

    shutil.rmtree(artifact_dir("pretrained"))                  # a fresh machine: nothing cached
    monkeypatch.setenv(store.STORE_ONLY_ENV, "1")
    again = store.pretrained(config, "ci")
    assert again.keys() == first.keys() and all(torch.equal(again[k], first[k]) for k in first)
    assert (pretrained_dir(config) / "weights.pt").is_file()  # seeded into the cache for runs computed here
    with pytest.raises(store.MissingRunError, match="pretrained model lm-l2-.* is not in the store"):
        store.pretrained(preset("lm", "ci", 2), "ci")


def test_pretrained_models_in_the_cache_are_recorded_except_ci_ones(tmp_store):
    """After a run, the pretrained models of the cpu/paper presets that the library's cache holds go into the store
    (once); ci-scale ones stay out."""
    import torch

    from subfl.pretraining import preset, pretrained_dir

    for scale in ("cpu", "ci"):
        folder = pretrained_dir(preset("lm", scale, 3))
        folder.mkdir(parents=True)
        torch.save({"w": torch.arange(3.0)}, folder / "weights.pt")
        (folder / "summary.json").write_text(json.dumps({"eval_loss": 4.2}))
    root = tmp_store / "store" / "pretrained"
    name = pretrained_dir(preset("lm", "cpu", 3)).name
    assert store.record_pretrained_cache(root) == [name]
    assert sorted(p.name for p in root.iterdir()) == [name]
    assert torch.equal(torch.load(root / name / "weights.pt")["w"], torch.arange(3.0))
    assert store.record_pretrained_cache(root) == []                  # recorded once
