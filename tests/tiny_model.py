"""A GRPOTrainer-ready model built in code: nothing is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_model_dir(root: Path) -> tuple[str, Any]:
    """A one-layer Llama and a character-level tokenizer, built in code and saved locally: the
    reference model (beta > 0) is loaded from the policy's path, and nothing is downloaded."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789 +=?":
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                        eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1, bos_token_id=None)
    path = root / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), tokenizer
