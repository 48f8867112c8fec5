"""Small random-init configs of every architecture layersim runs (hidden 32, 3 layers, 2 heads by default; another
width and depth on request, e.g. to stack models of different shapes in the compare stage), for tests and offline
runs: each runs in milliseconds with its family's kind of tokenizer (layersim.models.tiny_tokenizers: byte-level
BPE, SentencePiece-style Unigram, or MiniLM's WordPiece). Importing this module imports no
torch or transformers (the registry and params read the names)."""

from __future__ import annotations

from layersim.errors import LayersimError, unknown_name

# Each family's own names for the shared sizes: hidden, layers, heads, feed-forward width, positions.
_BERT_NAMES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings")
_SIZE_NAMES = {
    "distilbert": ("dim", "n_layers", "n_heads", "hidden_dim", "max_position_embeddings"),
    "gpt2": ("n_embd", "n_layer", "n_head", "n_inner", "n_positions"),
    "xlnet": ("d_model", "n_layer", "n_head", "d_inner", None),  # relative positions only
}
HIDDEN, LAYERS = 32, 3  # the default shape; the feed-forward width is twice the hidden size, 2 heads always
# MiniLM's special tokens ([CLS] 101, [SEP] 102), for configs whose defaults point past its vocabulary.
_SPECIALS = {"bos_token_id": 101, "eos_token_id": 102}
_DECODER = dict(num_key_value_heads=1, **_SPECIALS)  # one KV head: grouped-query attention is exercised too

# Family (= config.model_type) -> what differs from the family's defaults.
TINY_EXTRAS: dict[str, dict] = {
    "bert": {},
    "roberta": {},
    "xlm-roberta": {},
    # ALBERT shares one layer group across depth: the same weights run num_hidden_layers times.
    "albert": dict(embedding_size=16, num_hidden_groups=1, inner_group_num=1),
    "electra": dict(embedding_size=16),
    "distilbert": {},
    # DeBERTa-v3's shape: relative attention in buckets, normed relative embeddings, no absolute positions.
    "deberta-v2": dict(relative_attention=True, position_buckets=16, max_relative_positions=-1,
                       pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", position_biased_input=False,
                       type_vocab_size=0),
    # Global attention every 2nd layer (layers 0 and 2), local windows of 4 tokens: short texts see the difference.
    "modernbert": dict(local_attention=4, global_attn_every_n_layers=2, cls_token_id=101, sep_token_id=102,
                       **_SPECIALS),
    "mpnet": {},
    "xlnet": {},
    "gpt2": dict(_SPECIALS),
    "llama": dict(_DECODER),
    # Layer 0 full attention, layers 1-2 a sliding window of 4: Qwen2's per-layer layer_types.
    "qwen2": dict(use_sliding_window=True, sliding_window=4, max_window_layers=1, **_DECODER),
    "mistral": dict(sliding_window=4, **_DECODER),
}
ARCHITECTURES = tuple(TINY_EXTRAS)


def tiny_config(architecture: str, vocab_size: int, pad_token_id: int, hidden: int = HIDDEN, layers: int = LAYERS,
                **special_ids: int):
    """A small config of `architecture` (`layers` layers of width `hidden`, 2 heads) that runs in milliseconds.
    Decoders get `pad_token_id` too: their classification heads find each row's last non-pad token by it;
    `special_ids` (e.g. bos_token_id, eos_token_id of the model's own tokenizer) replace MiniLM's."""
    from transformers import AutoConfig

    if architecture not in TINY_EXTRAS:
        raise unknown_name("architecture", architecture, ARCHITECTURES)
    # 2 heads of an even width each (rotary embeddings rotate pairs of dimensions).
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 4 or hidden % 4:
        raise LayersimError(f"a tiny model's hidden size must be a positive multiple of 4 (2 heads of an even "
                            f"width), got {hidden!r}.")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise LayersimError(f"a tiny model's number of layers must be a positive integer, got {layers!r}.")
    names = _SIZE_NAMES.get(architecture, _BERT_NAMES)
    sizes = {name: value for name, value in zip(names, (hidden, layers, 2, 2 * hidden, 130)) if name is not None}
    return AutoConfig.for_model(architecture, vocab_size=vocab_size, pad_token_id=pad_token_id, **sizes,
                                **(TINY_EXTRAS[architecture] | special_ids))
