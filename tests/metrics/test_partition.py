import numpy as np
import pytest

from subfl.metrics import labels_per_client


def _clients(*counts):
    """Labels and parts of clients given as {class: samples} dicts."""
    labels, parts, start = [], [], 0
    for client in counts:
        mine = [c for c, n in client.items() for _ in range(n)]
        labels += mine
        parts.append(np.arange(start, start + len(mine)))
        start += len(mine)
    return np.array(labels), parts


def test_present_counts_every_class_and_covering_only_the_dominant_ones():
    labels, parts = _clients({0: 95, 1: 5}, {0: 25, 1: 25, 2: 25, 3: 25}, {7: 60, 8: 30, 9: 10})
    table = labels_per_client(labels, parts, 10, share=0.9)
    assert table.present.tolist() == [2, 4, 3]
    assert table.covering.tolist() == [1, 4, 2]          # 0.95 ≥ 0.9; 0.75 < 0.9 ≤ 1.0; 0.6 < 0.9 ≤ 0.9
    assert labels_per_client(labels, parts, 10, share=0.5).covering.tolist() == [1, 2, 1]
    assert labels_per_client(labels, parts, 10, share=1.0).covering.tolist() == [2, 4, 3]


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_share_outside_the_unit_interval_is_refused(share):
    labels, parts = _clients({0: 3})
    with pytest.raises(ValueError, match="share must be in"):
        labels_per_client(labels, parts, 10, share=share)


def test_an_empty_client_is_refused():
    labels, parts = _clients({0: 3})
    with pytest.raises(ValueError, match="hold no sample"):
        labels_per_client(labels, parts + [np.array([], dtype=int)], 10)
