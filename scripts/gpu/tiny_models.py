"""Random-weight models for the injection proof, built on the GPU host in seconds.

A differential test needs no trained weights: the same weights serve every run, and what is
compared is whether the canary changes the output. The shapes are what matter: a Whisper-shaped
encoder-decoder (non-causal cross-attention over 1500 encoder positions, head_dim 64) and a
DeepSeek-V2-shaped MLA model (576-wide latent KV: 512 + 64 rope), dense in every layer because
a kit without the fused-MoE library can serve no MoE layer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

WHISPER_FILES = ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "generation_config.json")


def whisper(tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """A 2+2-layer, 256-wide Whisper with the vocabulary and front end of `tokenizer_dir`.

    `tokenizer_dir` holds a Whisper checkpoint's tokenizer, feature extractor and config (the
    CPU fixture's tiny.en, for instance); only their sizes that matter to the vocabulary and
    the audio front end are kept.
    """
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    base = json.loads((tokenizer_dir / "config.json").read_text())
    config = {
        k: base[k]
        for k in (
            "vocab_size",
            "num_mel_bins",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "decoder_start_token_id",
        )
    }
    config |= {
        "d_model": 256,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 1024,
        "decoder_ffn_dim": 1024,
        "max_source_positions": 1500,
        "max_target_positions": 448,
        "init_std": 0.1,
        "tie_word_embeddings": True,
        "architectures": ["WhisperForConditionalGeneration"],
    }
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(WhisperConfig(**config)).to(torch.float16)
    model.save_pretrained(out, safe_serialization=True)
    for name in WHISPER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def deepseek_mla(tokenizer_dir: Path, out: Path, num_layers: int = 1, seed: int = 0) -> Path:
    """A DeepSeek-V2-shaped MLA model: kv_lora_rank 512 + rope 64 = 576-wide latent KV.

    The weights are written under vLLM's DeepSeek-V2 names directly, so no transformers
    modeling code (which changes between releases) is involved.
    """
    tok_config = json.loads((tokenizer_dir / "config.json").read_text())
    vocab = int(tok_config["vocab_size"])
    hidden, inter, heads, nope, rope, v_dim, lora = 256, 512, 4, 128, 64, 128, 512
    config: dict[str, Any] = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "kv_lora_rank": lora,
        "q_lora_rank": None,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v_dim,
        "hidden_act": "silu",
        "n_routed_experts": 0,
        "n_shared_experts": 0,
        "first_k_dense_replace": num_layers,
        "moe_layer_freq": 1,
        "moe_intermediate_size": inter,
        "num_experts_per_tok": 1,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "bos_token_id": tok_config.get("bos_token_id"),
        "eos_token_id": tok_config.get("eos_token_id"),
    }
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, std: float = 0.1) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    weights = {
        "model.embed_tokens.weight": rand(vocab, hidden, std=1.0),
        "model.norm.weight": rand(hidden) + 1,
        "lm_head.weight": rand(vocab, hidden),
    }
    for i in range(num_layers):
        p = f"model.layers.{i}"
        weights |= {
            f"{p}.input_layernorm.weight": rand(hidden) + 1,
            f"{p}.post_attention_layernorm.weight": rand(hidden) + 1,
            f"{p}.self_attn.q_proj.weight": rand(heads * (nope + rope), hidden),
            f"{p}.self_attn.kv_a_proj_with_mqa.weight": rand(lora + rope, hidden),
            f"{p}.self_attn.kv_a_layernorm.weight": rand(lora) + 1,
            f"{p}.self_attn.kv_b_proj.weight": rand(heads * (nope + v_dim), lora),
            f"{p}.self_attn.o_proj.weight": rand(hidden, heads * v_dim),
            f"{p}.mlp.gate_proj.weight": rand(inter, hidden),
            f"{p}.mlp.up_proj.weight": rand(inter, hidden),
            f"{p}.mlp.down_proj.weight": rand(hidden, inter),
        }
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out
