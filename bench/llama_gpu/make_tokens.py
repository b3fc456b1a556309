"""Random token shards for throughput runs that need no corpus (speed does
not depend on the token values), in llm.c's format: a header of 256 int32
(magic, version, count), then the tokens; uint32 (magic 20240801, version 7)
for vocabularies over 65536 ids, else uint16 (20240520, version 1).
    make_tokens.py OUT COUNT VOCAB [SEED]    (SEED: 0 by default)"""
import array, random, struct, sys
if len(sys.argv) < 4 or sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
out, n, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 0)
wide = vocab > 65536
with open(out, "wb") as f:
    f.write(struct.pack("<256i", 20240801 if wide else 20240520, 7 if wide else 1, n, *([0] * 253)))
    chunk = 1 << 20
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        a = array.array("I" if wide else "H", (rng.randrange(vocab) for _ in range(m)))
        if sys.byteorder != "little":
            a.byteswap()
        f.write(a.tobytes())
