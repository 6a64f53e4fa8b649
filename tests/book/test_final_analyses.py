"""Analyses of a run's final weights recorded with the run: read back without the weights, recomputed when missing."""
import gzip
import json

import pytest

from subfl.experiments import make_config
from subfl_book import final_analyses, store
from subfl_book.final_analyses import MissingAnalysisError, final_analysis, request_key
from subfl_book.submodel_eval import top_terms_accuracy

CONFIG = make_config("prism", "digits", scale="ci", rounds=2, max_train_samples=120, heterogeneity="0.5")
TOP_HALF = ("top_terms_accuracy", {"keep": 0.5})


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBFL_STORE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("SUBFL_WORK_DIR", str(tmp_path / "work"))
    return tmp_path


def test_request_keys_are_canonical_and_unknown_names_are_refused():
    assert request_key("top_terms_accuracy", {"keep": 0.5}) == request_key("top_terms_accuracy", {"keep": 1 / 2})
    assert request_key("leading_outputs_accuracy", {"output_keep": None}) == request_key("leading_outputs_accuracy")
    assert request_key("top_terms_accuracy", {"keep": 0.5}) == 'top_terms_accuracy{"keep": 0.5}'
    with pytest.raises(ValueError, match="not known; accepted: .*top_terms_accuracy"):
        request_key("top_terms", {"keep": 0.5})
    with pytest.raises(ValueError, match="parameter keep=\\[0.5\\]"):
        request_key("top_terms_accuracy", {"keep": [0.5]})
    assert final_analyses.normalise([TOP_HALF, ("top_terms_accuracy", {"keep": 0.5}), ("bn_recalibrated_accuracy", {})]
                                    ) == [("top_terms_accuracy", {"keep": 0.5}), ("bn_recalibrated_accuracy", {})]


def test_a_requested_analysis_is_recorded_and_read_back_without_the_weights(tmp_store):
    kept = store.run_experiment(CONFIG, keep_state=True, analyses=[TOP_HALF])
    from_weights = top_terms_accuracy(kept, 0.5)
    record = json.loads(gzip.decompress(store.record_path(kept.key).read_bytes()))
    entry = record["analyses"][request_key(*TOP_HALF)]
    assert entry["value"] == from_weights and entry["version"] == final_analyses.ANALYSES["top_terms_accuracy"].version
    assert 0.0 <= from_weights["top_terms_accuracy"] <= 1.0 and from_weights["keep"] == 0.5

    store.state_path(kept.key).unlink()   # the weights gone: the recorded value is what a page reads
    again = store.run_experiment(CONFIG, analyses=[TOP_HALF])
    assert final_analysis(again, "top_terms_accuracy", keep=0.5) == from_weights
    with pytest.raises(MissingAnalysisError, match='top_terms_accuracy\\{"keep": 0.25\\}.*analyses='):
        final_analysis(again, "top_terms_accuracy", keep=0.25)


def test_a_record_without_a_requested_analysis_counts_as_missing_and_is_computed_again(tmp_store, monkeypatch):
    plain = store.run_experiment(CONFIG)
    assert not store.recorded_enough(plain.key, store.root_for(CONFIG), analyses=[TOP_HALF])
    monkeypatch.setenv(store.STORE_ONLY_ENV, "1")
    with pytest.raises(store.MissingRunError, match="with its analyses"):
        store.run_experiment(CONFIG, analyses=[TOP_HALF])
    monkeypatch.delenv(store.STORE_ONLY_ENV)
    rerun = store.run_experiment(CONFIG, analyses=[TOP_HALF])
    assert rerun.final() == plain.final()   # the same run, now with the analysis
    assert final_analysis(rerun, "top_terms_accuracy", keep=0.5)["keep"] == 0.5

    other = ("top_terms_accuracy", {"keep": 0.25})
    more = store.run_experiment(CONFIG, analyses=[other])   # computed again for the new request ...
    assert set(more.analyses) == {request_key(*TOP_HALF), request_key(*other)}   # ... keeping the first value


def test_a_value_of_another_version_is_not_read(tmp_store, monkeypatch):
    run = store.run_experiment(CONFIG, analyses=[TOP_HALF])
    bumped = final_analyses.Analysis("top_terms_accuracy", final_analyses.ANALYSES["top_terms_accuracy"].function,
                                     version=final_analyses.ANALYSES["top_terms_accuracy"].version + 1)
    monkeypatch.setitem(final_analyses.ANALYSES, "top_terms_accuracy", bumped)
    assert final_analyses.recorded_value(run.analyses, *TOP_HALF) is None
    assert not store.recorded_enough(run.key, store.root_for(CONFIG), analyses=[TOP_HALF])


def test_decomposed_terms_from_the_config_equal_the_saved_factors(tmp_store):
    """The effective-rank pages read each layer's N from the architecture instead of the run's kept weights."""
    from subfl_book.pages.spectral import decomposed_terms, effective_rank_share

    run = store.run_experiment(CONFIG, keep_state=True)
    factors = run.state()["factors"]
    assert decomposed_terms(run) == {layer: len(f["singular_values"]) for layer, f in factors.items()}
    assert len(factors) >= 1 and all(n >= 1 for n in decomposed_terms(run).values())
    last = int(run.history.query("metric == 'effective_rank'")["round"].max())
    ranks = run.history.query("metric == 'effective_rank' and round == @last")
    by_hand = (ranks["value"] / ranks["group"].map({k: len(f["singular_values"]) for k, f in factors.items()})).mean()
    assert effective_rank_share(run, last) == by_hand


def test_a_diverged_run_records_its_requests_without_a_value_and_is_not_computed_again(tmp_store, monkeypatch):
    diverging = make_config("fedavg", "digits", scale="ci", rounds=2, max_train_samples=120, lr=1e30)
    run = store.run_experiment(diverging, analyses=[TOP_HALF])
    assert run.diverged
    assert run.analyses[request_key(*TOP_HALF)]["value"] is None
    assert store.recorded_enough(run.key, store.root_for(diverging), analyses=[TOP_HALF])
    monkeypatch.setattr(store, "compute_run", lambda *a, **k: pytest.fail("a diverged run was computed again"))
    again = store.run_experiment(diverging, analyses=[TOP_HALF])
    with pytest.raises(ValueError, match="diverged"):
        final_analysis(again, "top_terms_accuracy", keep=0.5)
