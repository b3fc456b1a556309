#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus (tests/fuzz/corpus/<target>/) from
the project's own files (configs/, tests/data/) and small well-formed
examples of each format. Run from anywhere; it replaces the corpus."""
import gzip
import hashlib, json, os, shutil, struct, sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
out = os.path.join(root, "tests", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def main():
    if os.path.isdir(out):
        shutil.rmtree(out)
    # TOML: every shipped config.
    cfg = os.path.join(root, "configs")
    for n in sorted(os.listdir(cfg)):
        if n.endswith(".toml"):
            put("toml_config", n, open(os.path.join(cfg, n), "rb").read())
    put("toml_config", "sets.toml",
        '[run]\nname = "x"\nsteps = 3\n[model]\nplugin = "mlp"\nhidden = [8, 4]\n'
        '[optimizer]\nplugin = "adam"\nlr = 1e-3\nbetas = [0.9, 0.99]\n'
        '[data.train]\nplugin = "synthetic"\n[zero]\nplugin = "stage3"\n')

    # DeepSpeed JSON: DeepSpeed's documented shapes.
    ds = [
        {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.001, "momentum": 0.9}}},
        {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.1}},
         "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 100}},
         "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8, "overlap_comm": True,
                               "offload_optimizer": {"device": "cpu", "pin_memory": True},
                               "stage3_prefetch_bucket_size": 5e7},
         "bf16": {"enabled": True}, "gradient_clipping": 1.0, "steps_per_print": 10,
         "wall_clock_breakdown": False},
        {"train_micro_batch_size_per_gpu": 16, "fp16": {"enabled": True, "loss_scale": 0,
                                                         "initial_scale_power": 16},
         "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                      "warmup_num_steps": 10, "warmup_type": "linear"}},
         "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}},
    ]
    for i, j in enumerate(ds):
        put("deepspeed_json", "ds%d.json" % i, json.dumps(j, indent=1))

    # safetensors: the golden files, and a tiny one of each dtype.
    for n in ("mlp_relu.safetensors", "optimizers.safetensors"):
        put("safetensors", n, open(os.path.join(root, "tests", "data", n), "rb").read())
    hdr, blob, off = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, dt, shape, size in (("a", "F32", [2, 2], 4), ("b", "BF16", [3], 2), ("c", "I64", [1], 8),
                                  ("d", "U8", [0, 5], 1)):
        n = size
        for s in shape:
            n *= s
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        blob += bytes(range(n))
        off += n
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    put("safetensors", "tiny.safetensors", struct.pack("<Q", len(h)) + h + blob)

    # Checkpoint manifest: the format save_checkpoint writes (2 ranks).
    def piece(name, slot, start, count, offset):
        return {"name": name, "slot": slot, "start": start, "count": count, "offset": offset,
                "block_crc32": [305419896]}
    manifest = {
        "format": "tessera-checkpoint", "version": 2, "step": 20, "epoch": 1, "batch_in_epoch": 3,
        "samples": 5120, "global_batch": 256, "seed": 42, "world_size": 2, "zero": "stage2",
        "optimizer": "adam", "slots": ["master", "exp_avg", "exp_avg_sq"], "model": "mlp",
        "params": [{"name": "0.weight", "shape": [4, 3], "group": 0, "canonical_offset": 0},
                   {"name": "0.bias", "shape": [4], "group": 0, "canonical_offset": 12}],
        "partition_rule": "canonical: parameters in declaration order, unpadded; each rank stores its owned ranges",
        "loss_scaler": None, "config": "[run]\nname = \"x\"\n",
        "files": [
            {"name": "rank_00000.safetensors", "rank": 0, "bytes": 296, "crc32": 1,
             "tensors": [piece("master.0", "master", 0, 8, 200), piece("exp_avg.0", "exp_avg", 0, 8, 232),
                         piece("exp_avg_sq.0", "exp_avg_sq", 0, 8, 264)]},
            {"name": "rank_00001.safetensors", "rank": 1, "bytes": 296, "crc32": 2,
             "tensors": [piece("master.1", "master", 8, 8, 200), piece("exp_avg.1", "exp_avg", 8, 8, 232),
                         piece("exp_avg_sq.1", "exp_avg_sq", 8, 8, 264)]},
        ],
    }
    # Version 3 with its checksum as manifest_checksum computes it (SHA-256
    # of the compact dump, keys sorted): the only version tessera reads, so
    # the fuzzer starts past the checksum into check_manifest.
    def signed(m):
        m = dict(m, version=3)
        m.pop("checksum", None)
        body = json.dumps(m, sort_keys=True, separators=(",", ":"))
        return dict(m, checksum="sha256:" + hashlib.sha256(body.encode()).hexdigest())
    put("ckpt_manifest", "manifest.json", json.dumps(signed(manifest), indent=1))
    fp16 = dict(manifest, loss_scaler={"cur_scale": 65536.0, "good_steps": 3, "cur_hysteresis": 2,
                                       "skipped_steps": 1})
    put("ckpt_manifest", "manifest_fp16.json", json.dumps(signed(fp16)))
    # check_manifest alone: the same manifest (version 3, its checksum not
    # checked here), and edits it must refuse: one tensor's start shifted
    # into its neighbour (an overlap and a gap), and out-of-range counters.
    v3 = dict(manifest, version=3, checksum="sha256:" + "0" * 64)
    put("ckpt_coverage", "manifest.json", json.dumps(v3, indent=1))
    shifted = json.loads(json.dumps(v3))
    shifted["files"][1]["tensors"][0]["start"] = 4
    put("ckpt_coverage", "overlap.json", json.dumps(shifted))
    put("ckpt_coverage", "ranges.json",
        json.dumps(dict(v3, epoch=10 ** 18, global_batch=0, batch_in_epoch=10 ** 15)))

    # IDX: images (3 dims) and labels (1 dim), plain and gzip.
    images = struct.pack(">IIII", 0x803, 2, 4, 4) + bytes(range(32))
    labels = struct.pack(">II", 0x801, 5) + bytes([0, 1, 2, 9, 3])
    put("idx", "images-idx3-ubyte", images)
    put("idx", "labels-idx1-ubyte", labels)
    put("idx", "images-idx3-ubyte.gz", gzip.compress(images, mtime=0))
    put("idx", "labels-idx1-ubyte.gz", gzip.compress(labels, mtime=0))

    # Token shards: llm.c's layout, uint16 and uint32.
    toks = [50256, 464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 50256]
    put("token_shard", "u16.bin", struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) +
        struct.pack("<%dH" % len(toks), *toks))
    put("token_shard", "u32.bin", struct.pack("<256i", 20240801, 7, len(toks), *([0] * 253)) +
        struct.pack("<%dI" % len(toks), *toks))

    # Tokenizer: a byte-level vocabulary (GPT-2's bytes_to_unicode) with a
    # few merges, encoder.json then vocab.bpe.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    b2u = {b: chr(c) for b, c in zip(bs, cs)}
    enc = {b2u[b]: i for i, b in enumerate(range(256))}
    merges = ["\u0120 t", "h e", "\u0120t he", "l l", "o r", "\u0120 w", "\u0120w or", "l d"]
    for m in merges:
        enc["".join(m.split(" "))] = len(enc)
    enc["<|endoftext|>"] = len(enc)
    bpe = "#version: 0.2\n" + "\n".join(merges) + "\n"
    put("tokenizer", "gpt2_small.txt", json.dumps(enc, ensure_ascii=False) + "\n#----vocab.bpe----\n" + bpe)


if __name__ == "__main__":
    sys.exit(main())
