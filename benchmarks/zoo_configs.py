"""Tiny configs for any transformers architecture, for the zoo (benchmarks/hf_zoo.py).

``tiny_config(arch)`` starts from the architecture's own default config and
shrinks it without breaking its structure:

- a size is set only under the names that config really stores (``hidden_size``
  or ``n_embd`` or ``d_model`` ...), so no stray attribute is added;
- per-layer lists and patterns (``layer_types``, ``hybrid_override_pattern``,
  ``mlp_only_layers`` ...) are cut to the new layer count, keeping one layer of
  each kind the default has, so a hybrid model stays hybrid;
- sub-configs (``text_config``, ``vision_config`` ...) are shrunk the same way;
- MoE and MLA fields (experts, top-k, groups, LoRA ranks) get small consistent
  values; dropout is 0; the cache is off.

``ARCH_OVERRIDES`` keeps the few values an architecture needs beyond that.
"""

from __future__ import annotations

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, SEQ, BATCH = 128, 64, 2, 4, 2, 128, 16, 2
HEAD_DIM = HIDDEN // HEADS

KV_NAMES = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_kv_heads")
EXPERT_NAMES = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
# (value, the names configs store it under): a list, as values repeat
SIZES = [
    (VOCAB, ("vocab_size", "vocab_size_per_layer_input")),
    (HIDDEN, ("hidden_size", "n_embd", "d_model", "n_embed", "embed_dim", "dim", "word_embed_proj_dim")),
    (HEADS, ("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads", "encoder_attention_heads",
            "decoder_attention_heads")),
    (KV_HEADS, KV_NAMES),
    (FFN, ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size", "encoder_ffn_dim", "decoder_ffn_dim",
          "dim_ff")),
    (32, ("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
          "expert_ffn_hidden_size")),
    (2, ("zero_expert_num",)),
    (64, ("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx", "max_sequence_length")),
    (4, EXPERT_NAMES),
    (8, ("sliding_window", "window_size", "attention_window", "rotary_dim", "qk_rope_head_dim", "qk_nope_head_dim",
        "attention_chunk_size")),
    (16, ("kv_lora_rank", "q_lora_rank", "v_head_dim", "d_kv")),
]
LAYER_NAMES = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
               "num_decoder_layers")
TOP_K_NAMES = ("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", "top_k", "experts_per_token")
ONE_NAMES = ("n_group", "num_group", "num_expert_group", "topk_group", "n_groups", "n_shared_experts", "num_shared_experts",
             "first_k_dense_replace")
ZERO_NAMES = ("num_kv_shared_layers",)  # layers reusing another layer's KV cache (gemma3n)
SUB_CONFIGS = ("text_config", "vision_config", "audio_config", "decoder_config", "encoder_config")
NONE_SET = {"num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size", "num_key_value_heads"}  # None -> set
TOKEN_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)

# What a generic shrink can't know. None: leave the default.
ARCH_OVERRIDES = {
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
    "falcon": dict(new_decoder_architecture=True),
    "mpt": dict(expansion_ratio=2),
    "persimmon": dict(partial_rotary_factor=0.5),
    "phi": dict(partial_rotary_factor=0.5),
    "stablelm": dict(partial_rotary_factor=0.25),
    "nemotron": dict(partial_rotary_factor=0.5),
    "glm": dict(partial_rotary_factor=0.5),
    "glm4": dict(partial_rotary_factor=0.5),
    "deepseek_v3": dict(num_key_value_heads=HEADS),
    "t5": dict(decoder_start_token_id=0),
    "bert": dict(type_vocab_size=2),
    "mamba2": dict(num_heads=8, head_dim=16),  # num_heads * head_dim == hidden_size * expand
    # defaults that do not build in transformers 5.24 itself: what is missing
    "dbrx": dict(attn_config={"kv_n_heads": KV_HEADS, "rope_theta": 10000.0, "clip_qkv": 8.0}),  # it reads both
    "cohere_compass_text": dict(rope_parameters={t: {"rope_type": "default", "rope_theta": 10000.0}
                                                 for t in ("full_attention", "sliding_attention")}),
    "dory": dict(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                 n_input_layers=1, n_recurrent_layers=1, n_output_layers=1),  # input + recurrent + output layers
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),  # its default has none
    "zaya": dict(num_experts_per_tok=1),  # the only top-k it supports
    "dots3_note": dict(text_config={"head_dim": 16}),  # its sliding-window head_dim is qk_nope + qk_rope
    "dots3_note_text": dict(head_dim=16),
}


def is_sub_config(name: str, value) -> bool:
    """A nested config: text_config, vision_config, blt's patcher_config / global_config, ..."""
    return isinstance(value, dict) and (name in SUB_CONFIGS or "model_type" in value or "hidden_size" in value)


def _cut_layers(value, n_default: int):
    """A per-layer list or pattern string cut to a few layers, one of each kind the default has."""
    kinds, seen = [], set()
    for item in value:
        key = repr(item)
        if key not in seen:
            seen.add(key)
            kinds.append(item)
    cut = (kinds + list(value[: LAYERS]))[: max(LAYERS, len(kinds))]
    return "".join(cut) if isinstance(value, str) else cut


def _is_index_list(value, n_layers: int) -> bool:
    """A list of layer indices (``moe_layers=[0, 1, ..., 47]``), not one entry per layer."""
    return (isinstance(value, list) and len(value) > 1 and all(type(i) is int for i in value)
            and all(a < b for a, b in zip(value, value[1:])) and value[-1] < n_layers)


def _layer_count(d: dict):
    for name in LAYER_NAMES:
        if isinstance(d.get(name), int) and d[name] > 0:
            return name, d[name]
    return None, None


def shrink(d: dict, top: bool = True) -> dict:
    """The keyword arguments that shrink one config dict (as ``to_dict()`` gives it)."""
    kw = {}
    for value, names in SIZES:
        for name in names:
            if isinstance(d.get(name), int) and not isinstance(d.get(name), bool):
                kw[name] = value
            elif name in NONE_SET and name in d and d[name] is None:
                kw[name] = value
    for name, value in d.items():  # head_dim, linear_head_dim, ...; linear_num_heads, ...
        if name in kw or not isinstance(value, int) or isinstance(value, bool):
            continue
        if name.endswith("head_dim"):
            kw[name] = HEAD_DIM
        elif name.startswith("hidden_size") and value > HIDDEN:  # hidden_size_global, ..._per_layer_input
            kw[name] = HIDDEN
        elif name.endswith("_vocab") and value > VOCAB:  # blt's hash-byte-group embeddings
            kw[name] = VOCAB
        elif name.endswith(("key_value_heads", "kv_heads")) and value > KV_HEADS:  # swa_num_key_value_heads
            kw[name] = KV_HEADS
        elif name.endswith("_heads") and value > HEADS:  # swa_num_attention_heads, linear_num_heads
            kw[name] = HEADS
    if "head_dim" in d and d["head_dim"] is None:  # models read it as it is
        kw["head_dim"] = HEAD_DIM
    if isinstance(d.get("kv_lora_rank"), int):  # MLA: the rotary part is head_dim, every head has its own K and V
        kw["head_dim"] = 8
        for name in KV_NAMES:
            if name in d:
                kw[name] = HEADS
    for name in TOP_K_NAMES:
        if name in d and d[name] is None and any(e in d for e in EXPERT_NAMES):
            kw[name] = 2
    if "is_decoder" in d:  # encoder models built as causal LMs
        kw["is_decoder"] = True
    for name in ("per_layer_config",):  # keyed by layer index
        if isinstance(d.get(name), dict):
            kw[name] = {k: v for k, v in d[name].items() if int(k) < LAYERS}
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if name in d and not top:
            kw[name] = TOKEN_IDS[name]
    for name in TOP_K_NAMES:
        if isinstance(d.get(name), int):
            kw[name] = 2
    for name in ZERO_NAMES:
        if isinstance(d.get(name), int) and d[name] > 0:
            kw[name] = 0
    for name in ONE_NAMES:
        if (isinstance(d.get(name), int) and d[name] > 1) or (name in d and d[name] is None and "expert" in name):
            kw[name] = 1
    layer_name, n_default = _layer_count(d)
    n_layers = LAYERS
    if layer_name:
        for name, value in d.items():
            if not isinstance(value, (list, str)) or len(value) != n_default or n_default < 2:
                continue
            if isinstance(value, str) and name.endswith(("_act", "_type", "_name", "activation")):
                continue
            if _is_index_list(value, n_default):
                continue
            kw[name] = _cut_layers(value, n_default)
            size = next((v for v, names in SIZES if name in names), None)
            if size is not None and all(isinstance(x, int) for x in kw[name]):  # gemma3n's intermediate_size
                kw[name] = [size] * len(kw[name])
            n_layers = max(n_layers, len(kw[name]))
        for name in LAYER_NAMES:
            if isinstance(d.get(name), int) and d[name] > 0:
                kw[name] = n_layers
        for name, value in kw.items():  # every per-layer list cut to the same length
            if name not in LAYER_NAMES and isinstance(value, (list, str)) and len(value) < n_layers:
                kw[name] = (value * n_layers)[:n_layers]
        for name, value in d.items():  # layer indices (llama4's moe_layers): those that still exist
            if "layer" in name and _is_index_list(value, n_default) and name not in kw:
                kw[name] = [i for i in value if i < n_layers] or [n_layers - 1]
    for name, value in d.items():
        if is_sub_config(name, value):
            kw[name] = dict(value, **shrink(value, top=False))
    return kw


POSITION_NAMES = next(names for value, names in SIZES if "max_position_embeddings" in names)


def tiny_config(arch: str, positions: int | None = None):
    """``positions``: the longest sequence the model takes, where the default tiny 64 is too short
    (the bucketing zoo runs lengths up to 250)."""
    from transformers import AutoConfig

    overrides = ARCH_OVERRIDES.get(arch, {})
    default = AutoConfig.for_model(arch)
    kw = dict(shrink(default.to_dict()), **TOKEN_IDS, tie_word_embeddings=False)
    if positions is not None:
        kw.update({name: positions for name in POSITION_NAMES if name in kw})
    for name, value in overrides.items():  # a dict for a sub-config is merged into it
        kw[name] = dict(kw[name], **value) if isinstance(value, dict) and isinstance(kw.get(name), dict) else value
    cfg = AutoConfig.for_model(arch, **kw)
    subs = [getattr(cfg, n, None) for n, v in cfg.to_dict().items() if is_sub_config(n, v)]
    for c in [cfg] + [s for s in subs if s is not None and hasattr(s, "__dict__")]:
        for name in list(vars(c)):
            value = getattr(c, name)
            if ("dropout" in name or "pdrop" in name) and isinstance(value, float):
                setattr(c, name, 0.0)
        c.use_cache = False
    return cfg
