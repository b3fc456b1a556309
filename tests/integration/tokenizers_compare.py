#!/usr/bin/env python3
"""tessera data encode/decode against Hugging Face's `tokenizers` library.

Builds three small byte-level BPE tokenizers shaped like the files GPT-2,
Llama 3 and Qwen2 ship (their pre-tokenizer regexes, Llama 3's
ignore_merges and <|begin_of_text|> template, Qwen2's NFC normalizer),
trains each on a small corpus, saves tokenizer.json, and checks that
`tessera data encode` gives tokenizer.encode(text).ids and `tessera data
decode` gives tokenizer.decode(ids) for a set of texts.

usage: tokenizers_compare.py TESSERA_BINARY WORK_DIR
Exit 0: all equal; 1: a difference (printed); 77: `tokenizers` is not
importable here (the test skips).
"""
import json
import os
import subprocess
import sys

try:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors, trainers
except ImportError:
    sys.exit(77)

# The Split regexes of Llama 3's and Qwen2's tokenizer.json.
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024 and they'll've gone.",
    "DeepSpeed's ZeRO-Offload trains 13B models on one GPU; tessera does it natively.",
    "naïve café résumé Ünïcödé coöperate — “quotes” and ‘more’ … ellipsis",
    "日本語のテキストと中文文本，还有한국어 텍스트도 있습니다。",
    "def main():\n    return [x ** 2 for x in range(10)]  # squares\n\n\n",
    "Numbers: 1234567890, 3.14159, 2,718, 1e-9, 0xDEADBEEF, 100%",
    "emoji 🙂🚀🎉 and symbols @#$%^&*()_+=[]{}|\\;:'\",.<>/?`~",
    "tabs\tand\nnewlines\r\n  leading and trailing spaces   ",
] * 20

TEXTS = [
    "Hello world", "", " ", "   multiple   spaces  ", "I'M SURE THEY'LL'VE DONE IT",
    "numbers 1234567 and 3.14159 and 12345678901234567890",
    "cafe\u0301 vs caf\u00e9 (NFD vs NFC)", "Ω≈ç√∫˜µ≤≥÷ åß∂ƒ©˙∆˚¬…æ",
    "日本語のテキスト、中文，한국어", "emoji 🙂🚀!! 👩‍👩‍👧‍👦", "tabs\tand\nnewlines\r\n\n",
    "<|begin_of_text|>text<|end_of_text|> and <|endoftext|>", "x" * 300,
    "def f(x):\n    return x**2\n\n\n\n# done", "mixed123abc 456def 7890ghi",
    "Zero\u200bwidth and non\u00a0breaking and ideographic\u3000space",
    "unseen words: zyzzyva quixotic xylophone", "'s 't 're 've 'm 'll 'd ' alone",
    "\n\n".join(CORPUS[:8]),
]

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>"]


def build(kind):
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3 if kind == "llama3" else QWEN2),
                                 behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if kind == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          special_tokens=[("<|begin_of_text|>", bos)]),
        ])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def save(tok, kind, work):
    path = os.path.join(work, kind + ".json")
    tok.save(path)
    if kind == "llama3":
        # Llama 3's own file has its merges as "a b" strings (the older form).
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        j["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                                for m in j["model"]["merges"]]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
    return path


def run(binary, args, stdin):
    r = subprocess.run([binary, "data"] + args, input=stdin, capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"tessera data {' '.join(args)} failed: {r.stderr.decode()}")
    return r.stdout


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    bad = 0
    for kind in ("gpt2", "llama3", "qwen2"):
        tok = build(kind)
        path = save(tok, kind, work)
        for text in TEXTS:
            want = tok.encode(text).ids
            got = json.loads(run(binary, ["encode", "--tokenizer", path], text.encode()))
            if got != want:
                bad += 1
                print(f"{kind}: encode({text!r}) = {got}, tokenizers: {want}")
            back = run(binary, ["decode", "--tokenizer", path], json.dumps(want).encode())
            if back.decode("utf-8", errors="replace") != tok.decode(want, skip_special_tokens=False):
                bad += 1
                print(f"{kind}: decode({want}) = {back!r}, tokenizers: "
                      f"{tok.decode(want, skip_special_tokens=False)!r}")
    print(f"{3 * len(TEXTS)} texts, {bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
