"""The inference-cost comparison of CAFF Sec. 1 (tiny LMs against GPT-2 124M), computed from shapes alone."""
import pytest

from subfl_book.pages.caff import inference_flops_against_gpt2


def test_gpt2_is_built_with_its_published_size_and_the_tiny_models_are_cheaper_by_the_expected_factors():
    table = inference_flops_against_gpt2(depths=(3, 9), tokens=256).set_index("model")
    assert table.loc["GPT-2 124M", "parameters"] == 124_439_808  # GPT-2 small, output layer tied to the embedding
    # matrix products of one 256-token sequence: per token 2 x (12 d^2 per block + d V for the head) plus attention
    d, V, T = 96, 8192, 256
    per_block = 2 * 12 * d * d * T + 2 * 2 * T * T * d  # linear maps, then q·k and attention·v
    assert table.loc["tiny LM, l = 3", "GFLOPs"] * 1e9 == pytest.approx(3 * per_block + 2 * d * V * T, rel=1e-9)
    assert table.loc["tiny LM, l = 9", "GPT-2 / model"] == pytest.approx(57.66, abs=0.01)
    assert table.loc["tiny LM, l = 3", "GPT-2 / model"] == pytest.approx(101.33, abs=0.01)


def test_model_names_read_as_the_paper_writes_them():
    from subfl_book.pages.caff import finetuning_name, layer_key, lora_key, model_name

    assert model_name(3, 1) == "F₃¹" and model_name(12) == "F₁₂" and model_name(9, 10) == "F₉¹⁰"
    assert finetuning_name(layer_key(6, 2)) == "F₆²" and finetuning_name(lora_key(6, 4)) == "LoRA r = 4 on F₆"
