"""Sequence classification on an encoder (HF BertForSequenceClassification): the pooler's vector of
the first token through one linear layer -> a logit per label. With one label it is a cross-encoder:
the relevance score of a (query, document) pair encoded as one input."""

from __future__ import annotations

from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import ConfigError
from anatomy.models.encoder import Encoder


class SequenceClassifier(nn.Module):
    """model(input_ids [B, S], attention_mask, token_type_ids) -> logits [B, n_labels]."""

    def __init__(self, config: ModelConfig, *, backend: str = "sdpa") -> None:
        super().__init__()
        if config.n_labels < 1:
            raise ConfigError(f"SequenceClassifier needs n_labels >= 1, got {config.n_labels}")
        self.config = config
        self.encoder = Encoder(config, pooler=True, backend=backend)
        self.classifier = nn.Linear(config.d_model, config.n_labels)

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.encoder.token_embedding

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                *, weights: list[Tensor] | None = None) -> Tensor:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids, weights=weights)  # [B, S, D]
        return self.classifier(self.encoder.pool(hidden))  # [B, D] -> [B, n_labels]
