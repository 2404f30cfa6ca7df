"""A Flax language model with dropout: an embedding, one attention block, next-token logits of
(batch, time, vocabulary); given the targets, (logits, loss) as well. Written for gpubench's tests."""
import flax.linen as nn
import jax.numpy as jnp
import optax


class TinyLM(nn.Module):
    vocab: int
    width: int
    heads: int

    @nn.compact
    def __call__(self, tokens, targets=None, train: bool = False):
        x = nn.Embed(self.vocab, self.width)(tokens)
        x = x + nn.Embed(tokens.shape[1], self.width)(jnp.arange(tokens.shape[1]))
        mask = nn.make_causal_mask(tokens)
        y = nn.MultiHeadDotProductAttention(self.heads)(nn.LayerNorm()(x), mask=mask)
        x = x + nn.Dropout(0.1, deterministic=not train)(y)
        x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x))))
        logits = nn.Dense(self.vocab)(nn.LayerNorm()(x))
        if targets is None:
            return logits
        return logits, optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def flax_lm(vocab=128, width=32, heads=4):
    return TinyLM(vocab, width, heads)
