"""Writes a tiny random-weight llama GGUF so tests can run real llama.cpp without downloading a model.

    python tests/real_upstream/tiny_gguf.py OUT.gguf [--seed N]

Why the weights look the way they do:

* The vocabulary is SentencePiece-style (llama.cpp's "llama" tokenizer): three special tokens, the
  256 byte tokens ``<0x00>``..``<0xFF>`` that let any UTF-8 prompt tokenize, then whole words
  spelled ``▁word``. Prompts fall back to bytes, which is fine: only generation needs words.
* Generation must never stop early or emit broken UTF-8, so that a test sees exactly
  ``max_tokens`` readable tokens. The output projection has all-zero rows for every non-word
  token (logit 0) and gives the words in pairs opposite rows ``+r`` and ``-r``. For any hidden
  state one word of each pair scores ``>= 0``, so greedy decoding always picks a word and never
  the end-of-sequence token.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import gguf
import numpy as np

WORD_MARK = "\u2581"  # SentencePiece's visible space: "▁cat" detokenizes to " cat"
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: unknown, begin, end of sequence
ONSETS = ("b", "d", "f", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
VOWELS = ("a", "e", "i", "o", "u")

# ChatML layout (llama.cpp recognises it with or without its Jinja engine).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def word_list() -> list[str]:
    """Pronounceable two-syllable words ("bada", "bade"…): 65² = 4225, plenty for a toy vocabulary."""
    syllables = [onset + vowel for onset, vowel in itertools.product(ONSETS, VOWELS)]
    return [a + b for a, b in itertools.product(syllables, repeat=2)]


def vocabulary(n_words: int) -> tuple[list[str], list[int]]:
    """Token texts and llama.cpp token types: specials, byte fallback, then `n_words` words."""
    tokens = list(SPECIAL_TOKENS)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    words = word_list()[:n_words]
    tokens += [WORD_MARK + word for word in words]
    types += [gguf.TokenType.NORMAL] * len(words)
    return tokens, [int(t) for t in types]


def output_projection(rng: np.random.Generator, n_vocab: int, first_word: int, n_embd: int) -> np.ndarray:
    """Logit rows: zero for non-words, `+r`/`-r` pairs for words, so the argmax is always a word."""
    rows = np.zeros((n_vocab, n_embd), dtype=np.float32)
    n_pairs = (n_vocab - first_word) // 2
    directions = rng.standard_normal((n_pairs, n_embd)).astype(np.float32)
    rows[first_word:first_word + 2 * n_pairs:2] = directions
    rows[first_word + 1:first_word + 2 * n_pairs:2] = -directions
    return rows


def write_tiny_gguf(
    path: Path,
    *,
    seed: int = 0,
    n_words: int = 500,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    context_length: int = 2048,
) -> Path:
    """Write the model to `path` (a few hundred KB, well under a second) and return `path`."""
    if n_embd % n_head or n_head % n_head_kv or (n_embd // n_head) % 2:
        raise ValueError("n_embd must split into an even head size over n_head, and n_head over n_head_kv")
    if not 2 <= n_words <= len(word_list()):
        raise ValueError(f"n_words must be between 2 and {len(word_list())}")
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary(n_words)
    first_word = len(SPECIAL_TOKENS) + 256
    head_dim = n_embd // n_head

    def weight(n_out: int, n_in: int) -> np.ndarray:
        # numpy (rows, columns) is ggml's [n_in, n_out]: one row per output unit.
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"llamaswap-tiny-{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    writer.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), n_embd)).astype(np.float32))
    ones = np.ones(n_embd, dtype=np.float32)
    for layer in range(n_layer):
        block = f"blk.{layer}."
        writer.add_tensor(block + "attn_norm.weight", ones)
        writer.add_tensor(block + "attn_q.weight", weight(n_head * head_dim, n_embd))
        writer.add_tensor(block + "attn_k.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(block + "attn_v.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(block + "attn_output.weight", weight(n_embd, n_head * head_dim))
        writer.add_tensor(block + "ffn_norm.weight", ones)
        writer.add_tensor(block + "ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(block + "ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(block + "ffn_down.weight", weight(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", output_projection(rng, len(tokens), first_word, n_embd))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a tiny random-weight llama GGUF for tests.")
    parser.add_argument("out", type=Path, help="where to write the .gguf file")
    parser.add_argument("--seed", type=int, default=0, help="different seeds give different models")
    args = parser.parse_args(argv)
    path = write_tiny_gguf(args.out, seed=args.seed)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
