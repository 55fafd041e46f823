"""Write the test LLM: a seeded random-weight ``LlamaForCausalLM`` and a byte-level BPE tokenizer;
and the reference engine's tokenizer, one token a word.

Run by :mod:`tests.support.llm_model` with the vLLM environment's interpreter
(``.venv-vllm/bin/python``: torch, transformers and tokenizers come with vLLM; the project's own
environment has none of them), or for the word tokenizer with AIPerf's (transformers and
tokenizers come with it too)::

    .venv-vllm/bin/python tests/support/llm_model_build.py model DEST SPEC_JSON
    .venv-aiperf/bin/python tests/support/llm_model_build.py word-tokenizer DEST

``SPEC_JSON`` is the ``LlamaConfig`` fields and ``seed`` (:data:`tests.support.llm_model.SPEC`).
Nothing comes from a model hub: the weights are drawn by torch from the seed (a transformer's
compute cost does not depend on its weight values), the tokenizer is trained here on a few lines
and padded with added tokens to the model's vocabulary, and it carries a chat template so the
chat endpoint serves too. The files land in ``DEST.tmp`` and are renamed to ``DEST`` at the end,
so a folder that exists is complete.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

#: The lines the tokenizer learns its merges from: English prose, numbers and punctuation, so
#: that AIPerf's synthetic prompts (English text) and the words of perfsweep's prompts both
#: split into a few bytes-to-words merges.
CORPUS = [
    "The quick brown fox jumps over the lazy dog while the band plays on.",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.",
    "A server batches requests; each step runs the sequences that are decoding.",
    "Time to first token, inter-token latency and tokens per second measure a stream.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024",
    "Now is the winter of our discontent made glorious summer by this sun of York.",
    "All the world's a stage, and all the men and women merely players.",
    "tok tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 tok8 tok9 word words token tokens",
]

#: Jinja chat template: "role: content" lines, then "assistant:" when a reply is wanted.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]


def write_tokenizer(dest: Path, vocab_size: int) -> dict[str, int]:
    """Train a byte-level BPE of at most ``vocab_size`` entries, pad it to exactly that many
    with added tokens (vLLM checks that no token id reaches past the embedding), and save it as a
    ``PreTrainedTokenizerFast``. Returns the special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
    )
    missing = vocab_size - len(fast)
    if missing < 0:
        raise SystemExit(f"the tokenizer has {len(fast)} entries, more than {vocab_size}")
    fast.add_tokens([f"<extra_{i}>" for i in range(missing)])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)
    return {name: fast.convert_tokens_to_ids(name) for name in SPECIAL_TOKENS}


def write_model(dest: Path, spec: dict[str, int]) -> None:
    """The tokenizer and a seeded ``LlamaForCausalLM`` of ``spec`` (float32, safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = dict(spec)
    seed = fields.pop("seed")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    ids = write_tokenizer(tmp, fields["vocab_size"])
    config = LlamaConfig(
        **fields,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"],
        torch_dtype="float32",
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / "perfsweep-spec.json").write_text(json.dumps(spec, sort_keys=True) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def write_word_tokenizer(dest: Path) -> None:
    """A tokenizer that counts as the reference engine does: one token per whitespace-separated
    word. A word it does not know is ``<unk>``, itself one word when decoded, so a client that
    builds a prompt of N tokens with it (AIPerf does: slices of N token ids, decoded) sends the
    reference engine N words, its N tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for line in CORPUS for w in line.split()})
    vocab = {name: i for i, name in enumerate(["<unk>", *SPECIAL_TOKENS, *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fast.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "model":
        write_model(Path(argv[1]), json.loads(argv[2]))
    elif len(argv) == 2 and argv[0] == "word-tokenizer":
        write_word_tokenizer(Path(argv[1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
