"""A BERT-style encoder as users write one: a dict of inputs (token ids and an attention mask
with padding), a classification of each sequence from its first token, a dict output. Written
for gpubench's tests; the batch function makes the inputs."""
import numpy as np
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, vocab, width, layers, heads, classes):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.classify = nn.Linear(width, classes)

    def forward(self, input_ids, attention_mask):
        x = self.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
        return {"logits": self.classify(x[:, 0]), "hidden": x}


def encoder(vocab=128, width=32, layers=2, heads=4, classes=4):
    return Encoder(vocab, width, layers, heads, classes)


def encoder_batches(batch_size, length=32, vocab=128, classes=4):
    """Sequences of random lengths, padded with 0 and masked; the class is the first token's
    residue, a task the encoder can learn."""
    rng = np.random.default_rng(batch_size)
    ids = rng.integers(1, vocab, (batch_size, length))
    lengths = rng.integers(length // 2, length + 1, batch_size)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    ids = ids * mask
    return {"input_ids": ids, "attention_mask": mask}, ids[:, 0] % classes
