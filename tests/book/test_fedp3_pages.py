"""subfl_book.pages.fedp3: the App. B.2 split statistic."""
import numpy as np
import pytest

from subfl_book.pages.fedp3 import top_class_share


def test_top_class_share_counts_each_clients_most_frequent_classes():
    labels = np.array([0, 0, 0, 1, 1, 2, 3, 4, 5, 5, 6, 6])
    parts = [np.arange(10), np.array([10, 11, 0])]  # client 0: counts 3,2,1,1,1,2 -> top 4 = 3+2+2+1 = 8 of 10
    assert top_class_share(labels, parts, k=4) == pytest.approx([0.8, 1.0])
    assert top_class_share(labels, parts, k=1) == pytest.approx([0.3, 2 / 3])


def test_top_class_share_refuses_bad_input():
    with pytest.raises(ValueError, match="k=0"):
        top_class_share([0, 1], [np.array([0])], k=0)
    with pytest.raises(ValueError, match="client 1 holds no sample"):
        top_class_share([0, 1], [np.array([0]), np.array([], dtype=int)])
