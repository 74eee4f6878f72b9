"""Writes sentence-transformers/all-MiniLM-L6-v2 as a GGUF file for llama.cpp's BERT support.

The same pinned safetensors weights the in-process model is built from, in f32 (no
quantization), with mean pooling, so the server's vectors match cairn's own model (cosine
>= 0.999). The layout follows llama.cpp's BERT conversion (convert_hf_to_gguf.py's BertModel):
WordPiece vocabulary in phantom-space form, special tokens from the tokenizer files, tensor
names from gguf-py's BERT map. Written with gguf-py and numpy only (the converter itself needs
torch, which is not installed for this).

Usage: python build_gguf.py MODEL_DIR OUT.gguf  (MODEL_DIR: model.safetensors, config.json,
vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json)
"""

import json
import os
import struct
import sys
from pathlib import Path

import gguf
import numpy as np

SPECIAL = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}


def read_safetensors(path):
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        data = handle.read()
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        start, end = info["data_offsets"]
        yield name, np.frombuffer(data[start:end], dtype=np.float32).reshape(info["shape"])


def main():
    model_dir, out = Path(sys.argv[1]), sys.argv[2]
    config = json.loads((model_dir / "config.json").read_text())
    blocks = config["num_hidden_layers"]
    writer = gguf.GGUFWriter(out + ".tmp", gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_block_count(blocks)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    tokens = (model_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    types = [gguf.TokenType.CONTROL if token in SPECIAL else gguf.TokenType.NORMAL
             for token in tokens]
    phantom = [token if kind == gguf.TokenType.CONTROL
               else token[2:] if token.startswith("##") else "\u2581" + token
               for token, kind in zip(tokens, types)]
    writer.add_token_type_count(config.get("type_vocab_size", 1))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(phantom)
    writer.add_token_types(types)
    gguf.SpecialVocab(model_dir, n_vocab=len(tokens)).add_to_gguf(writer)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, blocks)
    for name, tensor in read_safetensors(model_dir / "model.safetensors"):
        if name in ("embeddings.position_ids",) or name.startswith("pooler."):
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise SystemExit(f"build_gguf: no GGUF name for tensor {name}")
        writer.add_tensor(mapped, np.ascontiguousarray(tensor))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
