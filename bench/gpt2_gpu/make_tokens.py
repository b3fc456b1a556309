"""Random GPT-2 token shards in llm.c's format (header: 256 int32, magic
20240520, version 1, count; then uint16 tokens) for throughput runs that
need no corpus: speed does not depend on the token values.
    make_tokens.py OUT COUNT [SEED]    (SEED: 0 by default)"""
import random, struct, sys
out, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
with open(out, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    chunk = 1 << 20
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        f.write(struct.pack(f"<{m}H", *(rng.randrange(50257) for _ in range(m))))
