"""A GPT-style decoder-only language model: token and position embeddings, pre-LN causal
transformer blocks, a final layer norm and an output head tied to the token embedding (GPT-2's
shape, Radford et al. 2019). Trained on the synthetic next-token task
(gpubench.workloads.data.synthetic_tokens). The defaults are a small model for CPUs; GPT-2
small (124M) is ``layers=12 d_model=768 heads=12 seq_len=1024 vocab=50257``.
"""

from __future__ import annotations

from gpubench.workloads.base import (
    LayerNorm,
    Param,
    TiedLMHead,
    TokenEmbedding,
    TransformerBlock,
    Workload,
    WorkloadSpec,
)


def build_gpt(layers: int, d_model: int, heads: int, seq_len: int, vocab: int) -> WorkloadSpec:
    if d_model % heads:
        raise ValueError(f"gpt: heads {heads} do not divide d_model {d_model}")
    blocks = tuple(TransformerBlock(heads, causal=True) for _ in range(layers))
    return WorkloadSpec(name="gpt", input_shape=(seq_len,), num_classes=vocab, kind="tokens",
                        layers=(TokenEmbedding(vocab, d_model), *blocks, LayerNorm(), TiedLMHead(vocab)))


GPT = Workload(
    "gpt",
    "GPT-style language model: `layers` pre-LN causal blocks of width `d_model` with `heads` heads (MLP 4 x "
    "wider, GELU) over `seq_len` tokens of a `vocab`-token vocabulary, the output head tied to the token "
    "embedding; trained to predict the next token",
    build_gpt,
    params=(
        Param("layers", 4, 1, "transformer blocks"),
        Param("d_model", 128, 1, "width of the tokens (a multiple of heads)"),
        Param("heads", 4, 1, "attention heads"),
        Param("seq_len", 128, 1, "tokens a sequence"),
        Param("vocab", 512, 2, "tokens in the vocabulary"),
    ),
    attention=True,
)
