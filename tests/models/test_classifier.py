"""SequenceClassifier against HF's BertForSequenceClassification: read from an HF checkpoint, the same
logits (fp32); written back, HF reads the same model; a config that cannot have the head is refused."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy import get_preset
from anatomy.errors import ConfigError
from anatomy.models import SequenceClassifier


@pytest.mark.parametrize("labels", [1, 3])
def test_logits_equal_hf_and_the_checkpoint_round_trips(tmp_path, labels):
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64, num_labels=labels)
    hf = transformers.BertForSequenceClassification(config).eval()
    torch.nn.init.normal_(hf.classifier.weight, std=1.0)
    hf.save_pretrained(tmp_path / "hf")
    ours = anatomy.load(tmp_path / "hf")
    assert isinstance(ours, SequenceClassifier) and ours.config.n_labels == labels
    ids = torch.randint(0, 100, (2, 9))
    segments = (torch.arange(9) >= 5).long().expand(2, 9)
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=segments, attention_mask=mask).logits
        assert (ours(ids, mask, segments) - expected).abs().max() < 1e-5
        anatomy.save(ours, tmp_path / "back")
        again = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "back").eval()
        assert type(again).__name__ == "BertForSequenceClassification"
        assert (again(input_ids=ids, token_type_ids=segments, attention_mask=mask).logits - expected).abs().max() < 1e-5


def test_labels_need_an_encoder_with_a_pooler():
    with pytest.raises(ConfigError, match="n_labels=1"):
        get_preset("llama-7b", n_labels=1)
    with pytest.raises(ConfigError, match="n_labels=-1"):
        get_preset("bert-base", n_labels=-1)
