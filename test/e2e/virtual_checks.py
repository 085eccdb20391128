"""test_virtual_ranks.sh's comparisons of a virtual-rank run with the real-rank run it simulates (the oracle):

  same RUN_A RUN_B     every train/val line of metrics.jsonl has the same loss, grad norm, tokens and byte counts,
                       and the last checkpoints are the same: model.bin byte for byte, and every rank's state file
                       field by field (the optimizer state byte for byte; the config recorded in it may differ only
                       in out_dir, resume and virtual_ranks)
  ckpt CK_A CK_B       the same for two checkpoint directories alone

Prints one line and exits 0 when they agree, 1 (with the first difference) when not.
"""
import json
import os
import struct
import sys

# The keys of the recorded config that may differ: where the run writes, how it started, how it ran its ranks.
FREE_KEYS = {"out_dir", "resume", "virtual_ranks", "steps", "checkpoint_every"}
METRIC_KEYS = ("step", "loss", "grad_norm", "tokens", "bytes_sent", "bytes_recv", "payload_bytes", "cum_bytes_sent")


def read_state(path):
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v

    def array():
        nonlocal pos
        (n,) = take("Q")
        b = data[pos:pos + n]
        pos += n
        return b

    head = take("II") + take("q") + take("ii") + take("QQQ") + take("4Q") + take("qq") + take("QQQ")
    config = json.loads(array())
    blob = array()
    assert pos == len(data), path
    return head, config, blob


def compare_checkpoints(a, b):
    if open(os.path.join(a, "model.bin"), "rb").read() != open(os.path.join(b, "model.bin"), "rb").read():
        return "model.bin differs"
    ranks = sorted(f for f in os.listdir(a) if f.startswith("state_rank"))
    if ranks != sorted(f for f in os.listdir(b) if f.startswith("state_rank")):
        return "different state files: %s vs %s" % (ranks, sorted(os.listdir(b)))
    for f in ranks:
        (ha, ca, ba), (hb, cb, bb) = read_state(os.path.join(a, f)), read_state(os.path.join(b, f))
        if ha != hb:
            return "%s: header differs: %s vs %s" % (f, ha, hb)
        for k in set(ca) | set(cb):
            if k not in FREE_KEYS and ca.get(k) != cb.get(k):
                return "%s: config key %s differs: %s vs %s" % (f, k, ca.get(k), cb.get(k))
        if ba != bb:
            at = next(i for i in range(min(len(ba), len(bb))) if ba[i] != bb[i]) if len(ba) == len(bb) else -1
            return "%s: optimizer state differs (%d vs %d bytes, first at %d)" % (f, len(ba), len(bb), at)
    return None


def last_checkpoint(run):
    d = os.path.join(run, "checkpoints")
    return os.path.join(d, sorted(x for x in os.listdir(d) if x.startswith("step_"))[-1])


def metrics(run):
    lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    return [tuple(l.get(k) for k in METRIC_KEYS) for l in lines if l.get("type") in ("train", "val")]


def main():
    mode, a, b = sys.argv[1:4]
    if mode == "same":
        ma, mb = metrics(a), metrics(b)
        if not ma or ma != mb:
            diff = next((x for x in zip(ma, mb) if x[0] != x[1]), (len(ma), len(mb)))
            print("metrics.jsonl differ (%s): %s" % (",".join(METRIC_KEYS), diff))
            return 1
        a, b = last_checkpoint(a), last_checkpoint(b)
    why = compare_checkpoints(a, b)
    if why:
        print(why)
        return 1
    states = len([f for f in os.listdir(a) if f.startswith("state_rank")])
    lines = "%d metric lines, " % len(ma) if mode == "same" else ""
    print("bit-identical (%smodel.bin and %d state files)" % (lines, states))
    return 0


if __name__ == "__main__":
    sys.exit(main())
