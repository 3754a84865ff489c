"""Output layers: hidden features [B, T, H] -> per-frame logits [B, T, K]."""

from torch import nn


class LinearClassifier(nn.Module):
    """Dropout then a per-frame linear layer (WeKws's LinearClassifier, plus optional dropout)."""

    def __init__(self, input_dim, output_dim, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(float(dropout))
        self.linear = nn.Linear(input_dim, output_dim)

    def forward(self, x):
        return self.linear(self.dropout(x))
