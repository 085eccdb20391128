"""Checks for test_elastic_resume.sh, independent of the trainer's code: reads checkpoints' state files as
docs/checkpoints.md and llmc/run/checkpoint.cpp lay them out, applies the elastic-resume rule as docs/checkpoints.md
states it (numpy, float64 mean rounded once to float32) and compares bit for bit; checks the trainer's window trace
(LLMC_TRACE_WINDOWS) against the windows an uninterrupted stream reads.

  elastic_checks.py rule OLD_CK NEW_CK            new ranks' optimizer state = the rule applied to the old ranks'
  elastic_checks.py windows EXPECT LOG...         the train windows traced in LOGs: none twice, and exactly the first
                                                  EXPECT windows of the first shard in order (--shuffle false; or ranges
                                                  "0-2,4-7"), or
                                                  with EXPECT = @REFLOG the same set as REFLOG's
  elastic_checks.py loss DIR                      the last train step's loss in DIR/metrics.jsonl
"""
import json
import os
import struct
import sys

import numpy as np


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v if len(v) > 1 else v[0]

    def array(self, itemsize):
        n = self.take("Q")
        b = self.data[self.pos:self.pos + n * itemsize]
        self.pos += n * itemsize
        return b


def state(path):
    r = Reader(open(path, "rb").read())
    magic, version = r.take("II")
    assert magic == 0x4C4C5354 and version == 2, path
    s = {"step": r.take("q"), "world": r.take("i"), "rank": r.take("i"), "position": r.take("QQQ")}
    r.take("4Q")  # sampling rng
    s["tokens"], _ = r.take("qq")
    r.take("QQQ")  # data fingerprint
    r.array(1)  # config
    s["blob"] = bytes(r.array(1))
    assert r.pos == len(r.data), path
    return s


def demo_momentum(blob):
    r = Reader(blob)
    assert bytes(r.array(1)) == b"demo"
    version = r.take("I")
    head = r.take("QQQQQ") + ((r.take("I"),) if version >= 2 else (0,))
    m = np.frombuffer(r.array(4), dtype=np.float32)
    pending = r.take("B") if version >= 3 else 0
    assert pending == 0 and r.pos == len(blob)
    return head, m


def ranks(ck):
    files = json.load(open(os.path.join(ck, "COMPLETE")))["files"]
    n = sum(1 for f in files if f.startswith("state_rank"))
    return [state(os.path.join(ck, "state_rank%d.bin" % r)) for r in range(n)]


def expected(old, j, m):
    """The rule of docs/checkpoints.md: which old ranks' momenta new rank j of m averages."""
    n = len(old)
    if m % n == 0:
        return [old[j % n]]
    if n % m == 0:
        return old[j::m]
    return old


def check_rule(old_ck, new_ck):
    old, new = ranks(old_ck), ranks(new_ck)
    n, m = len(old), len(new)
    for j, s in enumerate(new):
        assert s["step"] == old[0]["step"] and s["tokens"] == old[0]["tokens"], "step/tokens not carried"
        if s["blob"].startswith(struct.pack("<Q", 5) + b"adamw"):
            assert s["blob"] == old[0]["blob"], "new rank %d: AdamW state is not old rank 0's" % j
            continue
        head, got = demo_momentum(s["blob"])
        srcs = [demo_momentum(o["blob"]) for o in expected(old, j, m)]
        assert all(h == head for h, _ in srcs), "header differs"
        want = np.mean(np.stack([x.astype(np.float64) for _, x in srcs]), axis=0).astype(np.float32)
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            bad = int(np.sum(got != want))
            sys.exit("new rank %d of %d: momentum differs from the rule in %d of %d values" % (j, m, bad, len(got)))
    means = [np.mean(np.stack([demo_momentum(x["blob"])[1].astype(np.float64) for x in side]), axis=0)
             for side in (old, new)] if not old[0]["blob"].startswith(struct.pack("<Q", 5) + b"adamw") else None
    if means is not None:
        err = float(np.max(np.abs(means[0] - means[1])))
        scale = float(np.max(np.abs(means[0]))) or 1.0
        assert err <= scale * 2.0 ** -23, "mean over ranks moved by %g" % err
        print("%d -> %d ranks: each new rank's momentum is the rule's, bit for bit; mean over ranks kept within %.2g "
              "(max |mean| %.3g)" % (n, m, err, scale))
    else:
        print("%d -> %d ranks: every new rank holds old rank 0's AdamW state, bit for bit" % (n, m))


def windows(logs):
    seen = []
    for log in logs:
        for line in open(log, errors="replace"):
            if line.startswith("llmc window: ") and "_train_" in line:
                f = line.split()
                seen.append((os.path.basename(f[2]), int(f[4]), int(f[6])))  # file, epoch, window
    return seen


def check_windows(expect, logs):
    seen = windows(logs)
    dup = len(seen) - len(set(seen))
    if dup:
        sys.exit("%d window(s) read twice" % dup)
    if expect.startswith("@"):
        want = set(windows([expect[1:]]))
    else:
        shard = sorted(f for f, _, _ in seen)[0]
        ranges = [r.split("-") for r in expect.split(",")] if "-" in expect else [["0", str(int(expect) - 1)]]
        want = {(shard, 0, w) for a, b in ranges for w in range(int(a), int(b) + 1)}
    if set(seen) != want:
        sys.exit("windows read %d, expected %d: missing %s, extra %s" % (
            len(seen), len(want), sorted(want - set(seen))[:5], sorted(set(seen) - want)[:5]))
    print("%d windows, each read once, exactly the uninterrupted stream's" % len(seen))


def last_loss(d):
    loss = None
    for line in open(os.path.join(d, "metrics.jsonl")):
        j = json.loads(line)
        if j.get("type") == "train":
            loss = (j["step"], j["loss"])
    print("%d %.4f" % loss)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "rule":
        check_rule(sys.argv[2], sys.argv[3])
    elif cmd == "windows":
        check_windows(sys.argv[2], sys.argv[3:])
    elif cmd == "loss":
        last_loss(sys.argv[2])
