import pytest
import torch

from subfl.fl import History, Ledger, tensor_bytes
from subfl.fl.history import read_history


def test_ledger_counts_every_byte():
    ledger = Ledger()
    total = ledger.record(1, 3, "down", {"w": torch.zeros(4, 5), "b": torch.zeros(5, dtype=torch.float64),
                                         "n": torch.zeros((), dtype=torch.int64)}, {"lr": 0.1})
    assert tensor_bytes(torch.zeros(4, 5)) == 80
    assert total == 80 + 40 + 8 + len('{"lr": 0.1}')
    df = ledger.to_frame()
    assert list(df.columns) == ["round", "client", "direction", "name", "shape", "dtype", "bytes", "n_samples"]
    assert (df.n_samples == 0).all()  # downloads report no sample count
    assert df.loc[df.name == "w", "shape"].item() == "4x5"
    assert ledger.total_bytes("down") == total and ledger.total_bytes("up") == 0


def test_ledger_records_the_sample_count_of_an_upload():
    ledger = Ledger()
    ledger.record(2, 7, "up", {"w": torch.zeros(3)}, {"loss": 0.5}, n_samples=640)
    df = ledger.to_frame()
    assert df.n_samples.tolist() == [640, 640] and df.bytes.tolist() == [12, len('{"loss": 0.5}')]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="n_samples"):
            ledger.record(2, 7, "up", {"w": torch.zeros(3)}, n_samples=bad)
    with pytest.raises(ValueError, match="uploads only"):
        ledger.record(2, 7, "down", {"w": torch.zeros(3)}, n_samples=5)


def test_ledger_rows_of_an_older_checkpoint_have_an_unknown_sample_count():
    ledger = Ledger(rows=[(1, 0, "up", "w", "3", "float32", 12)])
    assert ledger.to_frame().n_samples.tolist() == [-1]


def test_history_roundtrip_is_exact(tmp_path):
    h = History()
    h.add(1, "accuracy", 0.1 + 0.2)
    h.add(1, "accuracy", 1 / 3, group="0.25")
    h.write_csv(tmp_path / "h.csv")
    df = read_history(tmp_path / "h.csv")
    assert df.value.tolist() == [0.1 + 0.2, 1 / 3]
    assert h.last("accuracy") == 0.1 + 0.2 and h.last("accuracy", "0.25") == 1 / 3


def test_a_nan_value_round_trips(tmp_path):
    h = History()
    h.add(1, "loss", float("nan"))
    h.add(1, "accuracy", 0.25, group="NA")  # a group literally named NA must stay a string
    h.write_csv(tmp_path / "history.csv")
    back = read_history(tmp_path / "history.csv")
    assert back.value.isna().tolist() == [True, False] and back.group.tolist() == ["global", "NA"]
