"""The short names benchmark results are filed under."""

from benchmarks.cards import card_tag


def test_card_tag_names_the_model_not_the_memory() -> None:
    assert card_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert card_tag("NVIDIA H200") == "h200"
    assert card_tag("NVIDIA A100-SXM4-80GB") == "a100"
    assert card_tag("cpu") == card_tag("") == card_tag(None) == "cpu"
