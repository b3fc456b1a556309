"""Random token shards for throughput runs that need no corpus (speed does
not depend on the token values), in llm.c's format: a header of 256 int32
(magic, version, count), then the tokens; uint32 (magic 20240801, version 7)
for vocabularies over 65536 ids, else uint16 (20240520, version 1).
With --examples MIN MAX the shard is tessera's SFT form for packing
(docs/data.md; versions 2007 / 2001): examples of MIN..MAX tokens end to
end, a loss mask after the tokens (every token trained but each example's
first), then the example count in header int32 [3] and their starts.
    make_tokens.py OUT COUNT VOCAB [SEED] [--examples MIN MAX]    (SEED: 0 by default)"""
import array, random, struct, sys
args = sys.argv[1:]
examples = None
if "--examples" in args:
    at = args.index("--examples")
    examples = (int(args[at + 1]), int(args[at + 2]))
    del args[at:at + 3]
if len(args) < 3 or args[0] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0 if args and args[0] in ("-h", "--help") else 2)
out, n, vocab = args[0], int(args[1]), int(args[2])
rng = random.Random(int(args[3]) if len(args) > 3 else 0)
wide = vocab > 65536
starts = []
if examples:
    lo, hi = examples
    t = 0
    while t < n:
        starts.append(t)
        t += rng.randint(lo, hi)
version = (2007 if wide else 2001) if examples else (7 if wide else 1)
with open(out, "wb") as f:
    f.write(struct.pack("<256i", 20240801 if wide else 20240520, version, n, len(starts),
                        *([0] * 252)))
    chunk = 1 << 20
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        a = array.array("I" if wide else "H", (rng.randrange(vocab) for _ in range(m)))
        if sys.byteorder != "little":
            a.byteswap()
        f.write(a.tobytes())
    if examples:
        mask = bytearray(b"\x01") * n
        for s in starts:
            mask[s] = 0
        f.write(bytes(mask))
        s = array.array("i", starts)
        if sys.byteorder != "little":
            s.byteswap()
        f.write(s.tobytes())
