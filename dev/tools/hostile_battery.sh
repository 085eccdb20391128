#!/usr/bin/env bash
# hostile_battery.sh: uses train_gpt_cpu, sample_gpt, eval_gpt and build/prepro_gpt2 the way a hostile user would
# (SIGKILLs at random moments, dead and stopped MPI ranks, full disks, bad and fuzzed inputs, divergence, stop signals,
# two trainers on one out_dir, requeues) on a tiny model, and prints "category: N cases, P held, F failed" per category,
# each failed case with one line of why, and a total. Exit status 1 when any case failed (2: could not start).
# Run from anywhere, after `make train_gpt_cpu sample_gpt eval_gpt build/prepro_gpt2` and data/prepare_default.sh:
#   bash dev/tools/hostile_battery.sh   (QUICK=1: about a quarter; KEEP=1 keeps the temp dir; KILLS=N; VERBOSE=1;
#   ONLY=kills,ranks,disk,bad,fuzz,diverge,stop,two,requeue runs those categories)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 2
QUICK=${QUICK:-0}
KEEP=${KEEP:-0}
ONLY=${ONLY:-}
if [[ $QUICK == 1 ]]; then KILLS=${KILLS:-5}; else KILLS=${KILLS:-20}; fi
RANDOM=12345
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
TRAIN=$ROOT/train_gpt_cpu
SAMPLE=$ROOT/sample_gpt
EVAL=$ROOT/eval_gpt
PREPRO=$ROOT/build/prepro_gpt2
PY=/usr/bin/python3
ENCODER=data/cache/gpt2/encoder.json
VOCAB=data/cache/gpt2/vocab.bpe
for f in "$TRAIN" "$SAMPLE" "$EVAL" "$PREPRO" "$PY" data/default/default_train_000001.bin data/default/default_val_000000.bin \
         data/default/tokenizer.bin "$ENCODER" "$VOCAB"; do
  [[ -e $f ]] || { echo "error: $f is missing (make train_gpt_cpu sample_gpt eval_gpt build/prepro_gpt2; data/prepare_default.sh)" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "error: mpirun is not installed" >&2; exit 2; }

W=$(mktemp -d /tmp/hostile_battery.XXXXXX) || exit 2
# every process started here carries this mark, so that any left running (Open MPI's orted daemon, which a trainer
# dying in its singleton MPI_Init leaves behind) is found by pid and ended
export HOSTILE_BATTERY_RUN=$W
BGPIDS=()
MOUNTS=()
strays() {  # pids of this battery's programs that are still running
  local p c
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    case $c in orted | prted | prterun | mpirun | train_gpt_cpu | sample_gpt | eval_gpt | prepro_gpt2 | timeout) ;; *) continue ;; esac
    { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qxF "HOSTILE_BATTERY_RUN=$W" || continue
    alive "$p" && echo "$p"
  done
}
reap() {  # ends the strays; echoes "name pid (RSS MB)" for each
  local p rss out=""
  for p in $(strays); do
    rss=$(ps -o rss= -p "$p" 2>/dev/null)
    out+="$(cat "/proc/$p/comm" 2>/dev/null) $p ($((${rss:-0} / 1024)) MB) "
    kill -KILL "$p" 2>/dev/null
  done
  echo "$out"
}
cleanup() {
  local p m
  for p in "${BGPIDS[@]}"; do  # our own background `timeout` wrappers: each leads its own process group
    kill -0 "$p" 2>/dev/null && { kill -CONT -- "-$p" 2>/dev/null; kill -KILL -- "-$p" 2>/dev/null; }
  done
  reap >/dev/null
  for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null; done
  if [[ $KEEP == 1 ]]; then echo "kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The tiny model: 1 layer, width 32, 2 heads, 32 positions (1.6M parameters, nearly all the embedding); B=2, T=32.
BASE=(--config configs/tiny.json --num_layers 1 --channels 32 --num_heads 2 --max_seq_len 32 --batch_size 2 --seq_len 32
      --val_every 5 --val_batches 1 --lr 1e-3 --warmup_steps 2)
S=24  # steps of every run that is compared to a reference
START=$SECONDS

# ---------------------------------------------------------------------------------------------------------------
# results
declare -A NC NH NF
CATS=()
FAILS=()
result() {  # category, case name, why ("" = held)
  local cat=$1 name=$2 why=${3:-}
  if [[ -z ${NC[$cat]+x} ]]; then CATS+=("$cat"); NC[$cat]=0; NH[$cat]=0; NF[$cat]=0; fi
  NC[$cat]=$((NC[$cat] + 1))
  if [[ -z $why ]]; then
    NH[$cat]=$((NH[$cat] + 1))
    [[ ${VERBOSE:-0} == 1 ]] && echo "  ok   ${name//$W/\$TMP}"
  else
    NF[$cat]=$((NF[$cat] + 1))
    why=${why//$W/\$TMP}
    name=${name//$W/\$TMP}
    FAILS+=("$cat: $name: ${why:0:400}")
    echo "  FAIL $name: ${why:0:400}"
  fi
}
want() { [[ -z $ONLY || ,$ONLY, == *,$1,* ]]; }
section() {
  local left
  left=$(reap)
  [[ -n $left ]] && echo "  note: ended processes still running from the category before: $left"
  echo "== $1 ($((SECONDS - START)) s)"
}

# ---------------------------------------------------------------------------------------------------------------
# processes
RC=0 FG_S=0 FG_LIMIT=0
run_fg() {  # limit prefix cmd...: runs cmd under timeout with stdout/stderr in prefix.out/.err; RC = its status
  local limit=$1 pre=$2 t0=$SECONDS
  shift 2
  timeout -k 3 "$limit" "$@" >"$pre.out" 2>"$pre.err" </dev/null
  RC=$?
  FG_S=$((SECONDS - t0)) FG_LIMIT=$limit
}
BG=0
run_bg() {  # limit prefix cmd...: the same in the background; BG = the timeout wrapper's pid
  local limit=$1 pre=$2
  shift 2
  timeout -k 3 "$limit" "$@" >"$pre.out" 2>"$pre.err" </dev/null &
  BG=$!
  BGPIDS+=("$BG")
}
child() {  # pid: its first child, waiting up to 2 s for it to appear
  local i c
  for i in $(seq 200); do
    c=$(pgrep -P "$1" | head -1)
    [[ -n $c ]] && { echo "$c"; return; }
    sleep 0.01
  done
}
rank_pid() {  # mpirun pid, rank: that rank's pid
  local c
  for c in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$c"; return; }
  done
}
alive() { [[ -e /proc/$1 ]] && ! grep -q '^[^ ]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
sleep_ms() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }
last_step() {  # out_dir: the last train step in its metrics.jsonl (0 if none)
  local s
  s=$(grep -o '"type":"train","step":[0-9]*' "$1/metrics.jsonl" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
  echo "${s:-0}"
}
wait_step() {  # out_dir step pid limit_s: until the step is logged or pid ends
  local t=$((SECONDS + $4))
  while ((SECONDS < t)) && kill -0 "$3" 2>/dev/null; do
    (($(last_step "$1") >= $2)) && return 0
    sleep 0.02
  done
  return 1
}
complete_ckpts() { local d; for d in "$1"/checkpoints/step_*; do [[ -f $d/COMPLETE ]] && echo "$d"; done; }
ckpt_steps() { complete_ckpts "$1" | sed 's/.*step_0*//' | tr '\n' ' '; }

# ---------------------------------------------------------------------------------------------------------------
# judging
CRASH='Segmentation fault|terminate called|Aborted|core dumped|double free|free\(\): |malloc\(\)|stack smashing|Floating point exception|Bus error|Illegal instruction|AddressSanitizer|signal 11|signal 6 '
crash() { grep -E -h -m1 "$CRASH" "$@" 2>/dev/null | head -1; }
errlines() {  # stderr's lines that are not warnings, the tools' summaries or mpirun's own boxed reports and daemon lines
  awk '/^----------+$/ { box = !box; next } !box' "$1" | grep -v -E '^(warning:|sample_gpt: |eval_gpt: |prepro_gpt2: )' |
    grep -v -E '^\[[^]]*:[0-9]+\] |^[[:space:]]*$'
}
WHY=""
status_why() {  # rc: why it is not an orderly exit, or "" (after run_fg: a kill at its time limit is a hang)
  case $1 in
    124) echo "hang (killed after ${FG_LIMIT} s)" ;;
    137) if ((FG_S >= FG_LIMIT)); then echo "hang (killed after ${FG_LIMIT} s)"; else echo "killed by signal 9"; fi ;;
    125 | 126 | 127) echo "could not run (timeout status $1)" ;;
    *) ((${1} >= 128)) && echo "killed by signal $(($1 - 128))" ;;
  esac
}
judge_fail() {  # prefix rc [needle]: a clean refusal: non-zero, one "error..." line (naming needle), no signal/hang
  local pre=$1 rc=$2 needle=${3:-} c n line
  WHY=$(status_why "$rc")
  [[ -n $WHY ]] && return
  c=$(crash "$pre.out" "$pre.err")
  [[ -n $c ]] && { WHY="crash: $c"; return; }
  [[ $rc == 0 ]] && { WHY="exit 0 (expected an error): $(tail -c 150 "$pre.out" | tr '\n' ' ')"; return; }
  n=$(errlines "$pre.err" | wc -l)
  line=$(errlines "$pre.err" | head -1)
  if [[ $n != 1 ]]; then WHY="exit $rc with $n lines on stderr: $(errlines "$pre.err" | head -3 | tr '\n' '|')"
  elif [[ $line != error* ]]; then WHY="exit $rc, stderr line is not an error: $line"
  elif [[ -n $needle && $line != *"$needle"* ]]; then WHY="error line does not name '$needle': $line"
  fi
}
judge_any() {  # prefix rc: success, or a clean refusal
  local c
  WHY=$(status_why "$2")
  [[ -n $WHY ]] && return
  c=$(crash "$1.out" "$1.err")
  [[ -n $c ]] && { WHY="crash: $c"; return; }
  [[ $2 == 0 ]] && return
  judge_fail "$1" "$2"
}
first_err() { errlines "$1" | grep -m1 -E 'error|rror' || errlines "$1" | head -1; }
exact() {  # reference_dir out_dir: metrics and final weights bit-identical; WHY otherwise
  WHY=$("$PY" "$W/cmp.py" "$1" "$2" 2>&1) || return
  local m
  m=$(printf 'checkpoints/step_%08d/model.bin' "$S")
  [[ -f $2/$m ]] || { WHY="no final checkpoint $m"; return; }
  cmp -s "$1/$m" "$2/$m" || WHY="final model.bin differs from the reference's"
}
loads() {  # out_dir: every complete checkpoint loads in sample_gpt; WHY otherwise
  local d
  WHY=""
  for d in $(complete_ckpts "$1"); do
    run_fg 60 "$W/load" "$SAMPLE" --model "$d" --tokens 1 --threads 1
    if [[ $RC != 0 ]]; then WHY="complete checkpoint ${d##*/} does not load (exit $RC): $(first_err "$W/load.err")"; return; fi
  done
}
leftover_tmp() { find "$1" -name '*.tmp' 2>/dev/null | head -1; }

# ---------------------------------------------------------------------------------------------------------------
# helpers in Python: metrics comparison and the fuzzer
cat >"$W/cmp.py" <<'EOF'
# cmp.py REF OUT: OUT's metrics.jsonl has REF's train and val lines bit for bit (timings aside), each step once.
import json, sys
KEYS = ("loss", "lr", "grad_norm", "tokens", "bytes_sent", "bytes_recv", "payload_bytes", "cum_bytes_sent")
def load(d):
    train, val, dup = {}, {}, []
    try:
        lines = open(d + "/metrics.jsonl").read().splitlines()
    except OSError as e:
        sys.exit(f"metrics.jsonl: {e.strerror}")
    for i, l in enumerate(lines):
        try:
            j = json.loads(l)
        except ValueError:
            sys.exit(f"metrics.jsonl line {i + 1} is not JSON: {l[:60]!r}")
        t = j.get("type")
        if t == "train":
            dup += [j["step"]] if j["step"] in train else []
            train[j["step"]] = {k: j.get(k) for k in KEYS}
        elif t == "val":
            dup += [f"val{j['step']}"] if j["step"] in val else []
            val[j["step"]] = j.get("val_loss")
    return train, val, dup
rt, rv, _ = load(sys.argv[1])
gt, gv, dup = load(sys.argv[2])
if dup:
    sys.exit(f"metrics.jsonl logs step(s) {dup[:4]} twice")
missing, extra = sorted(set(rt) - set(gt)), sorted(set(gt) - set(rt))
if missing or extra:
    sys.exit(f"train steps missing {missing[:6]} / extra {extra[:6]} ({len(gt)} logged, reference {len(rt)})")
last = max(rt)
for s in [last] + sorted(rt):
    if gt[s] != rt[s]:
        k = next(k for k in KEYS if gt[s][k] != rt[s][k])
        sys.exit(f"step {s}{' (the last)' if s == last else ''}: {k} {gt[s][k]!r} vs reference {rt[s][k]!r}")
if sorted(gv) != sorted(rv):
    sys.exit(f"val steps {sorted(gv)} vs reference {sorted(rv)}")
for s in rv:
    if gv[s] != rv[s]:
        sys.exit(f"val loss at step {s}: {gv[s]!r} vs reference {rv[s]!r}")
EOF
cat >"$W/fuzz.py" <<'EOF'
# fuzz.py KIND SRC OUTDIR N SEED: N mutants of SRC, one line each "NAME<TAB>what<TAB>changed(0/1)".
# KIND: bin:<header bytes> (a file), text (a JSON file), ckpt (SRC a checkpoint dir: mutants are dirs).
import json, os, random, re, shutil, struct, sys
kind, src, out, n, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
os.makedirs(out, exist_ok=True)

def mutate_bin(data, hdr):
    b, n = bytearray(data), len(data)
    k = rng.choice(["flip", "flip", "hdrflip", "hdrflip", "hdrint", "hdrint", "truncate", "trunc_small", "append",
                    "zero", "insert"])
    if k == "flip":
        m = rng.randint(1, 16)
        for _ in range(m):
            b[rng.randrange(n)] ^= rng.randint(1, 255)
        return bytes(b), f"{m} random bytes flipped"
    if k == "hdrflip":
        m = rng.randint(1, 4)
        for _ in range(m):
            b[rng.randrange(min(hdr, n))] ^= rng.randint(1, 255)
        return bytes(b), f"{m} header bytes flipped"
    if k == "hdrint":
        slot = rng.randrange(min(hdr, n, 64) // 4)
        old = struct.unpack_from("<i", b, 4 * slot)[0]
        v = rng.choice([0, -1, 1, 2, 3, 2**31 - 1, -2**31, 65536, 10**9, old + 1, old - 1, old * 2,
                        max(-2**31, min(2**31 - 1, old * 1000))])
        struct.pack_into("<i", b, 4 * slot, v)
        return bytes(b), f"int32 {slot} {old} -> {v}"
    if k == "truncate":
        m = rng.randrange(n)
        return bytes(b[:m]), f"truncated to {m} bytes"
    if k == "trunc_small":
        m = rng.randrange(min(n, 2048))
        return bytes(b[:m]), f"truncated to {m} bytes"
    if k == "append":
        m = rng.randint(1, 4096)
        return bytes(b) + rng.randbytes(m), f"{m} garbage bytes appended"
    if k == "zero":
        i, m = rng.randrange(n), rng.randint(1, 4096)
        b[i:i + m] = bytes(len(b[i:i + m]))
        return bytes(b), f"{m} bytes zeroed at {i}"
    i, m = rng.randrange(n), rng.randint(1, 64)
    b[i:i] = rng.randbytes(m)
    return bytes(b), f"{m} bytes inserted at {i}"

VALUES = ["1e400", "-1", "0", "-0", "99999999999999999999", "1.5", "null", '"x"', "true", "[]", "{}", "NaN",
          "Infinity", "-1e-400", "0x10", "2147483648", '"1e-3"', "1e-45", "-9223372036854775809"]
def mutate_text(s):
    k = rng.choice(["char", "delete", "insert", "truncate", "append", "value", "value", "value", "key"])
    i = rng.randrange(max(1, len(s)))
    if k == "char":
        c = chr(rng.randint(32, 126))
        return s[:i] + c + s[i + 1:], f"char {i} -> {c!r}"
    if k == "delete":
        m = rng.randint(1, 8)
        return s[:i] + s[i + m:], f"{m} chars deleted at {i}"
    if k == "insert":
        t = rng.choice(["{", "}", "[", "]", '"', ",", ":", "-", "e", "9", ".", "\\", "\x00", "\u00e9", "nan", "1e999"])
        return s[:i] + t + s[i:], f"{t!r} inserted at {i}"
    if k == "truncate":
        return s[:i], f"truncated to {i} chars"
    if k == "append":
        t = rng.choice([" x", "}", '{"a":1}', ",", '\n{"steps":3}', "\x00\x01"])
        return s + t, f"{t!r} appended"
    if k == "value":
        nums = list(re.finditer(r'(?<=:)\s*(-?[0-9][0-9.eE+-]*|"[^"]*"|true|false)', s))
        if nums:
            m, v = rng.choice(nums), rng.choice(VALUES)
            return s[:m.start()] + v + s[m.end():], f"value {m.group().strip()} -> {v}"
    keys = list(re.finditer(r'"([A-Za-z_0-9.]+)"\s*:', s))
    if keys:
        m = rng.choice(keys)
        v = rng.choice([m.group(1)[:-1], m.group(1) + "s", "_" + m.group(1), "", m.group(1).upper(), "lr"])
        return s[:m.start()] + json.dumps(v) + ":" + s[m.end():], f"key {m.group(1)} -> {v!r}"
    return s + "}", "'}' appended"

for i in range(n):
    name = f"{i:03d}"
    if kind.startswith("bin"):
        data = open(src, "rb").read()
        new, what = mutate_bin(data, int(kind.split(":")[1]))
        open(os.path.join(out, name), "wb").write(new)
    elif kind == "text":
        data = open(src, encoding="utf-8").read()
        new, what = mutate_text(data)
        open(os.path.join(out, name), "w", encoding="utf-8", errors="surrogateescape").write(new)
    else:  # a checkpoint dir: mutate one file; with a stripped marker (no checksums) the readers see the damage
        d = os.path.join(out, name)
        os.makedirs(d)
        target = rng.choice(["state_rank0.bin", "state_rank0.bin", "model.bin", "COMPLETE"])
        strip = target != "COMPLETE" and rng.random() < 0.65
        for f in os.listdir(src):
            if f != target and not (f == "COMPLETE" and strip):
                os.link(os.path.join(src, f), os.path.join(d, f))
        data = open(os.path.join(src, target), "rb").read()
        if target == "COMPLETE":
            new, what = mutate_text(data.decode())
            new = new.encode("utf-8", "surrogateescape")
        else:
            new, what = mutate_bin(data, 64 if target.startswith("state") else 1024)
        open(os.path.join(d, target), "wb").write(new)
        if strip:
            marker = json.loads(open(os.path.join(src, "COMPLETE")).read())
            marker.pop("files", None)
            open(os.path.join(d, "COMPLETE"), "w").write(json.dumps(marker) + "\n")
        what = f"{target}: {what}" + (" (marker without checksums)" if strip else " (checksummed marker)")
    print(f"{name}\t{what}\t{int(new != data)}")
EOF

# ---------------------------------------------------------------------------------------------------------------
# references: one uninterrupted run per world size (checkpoint only at the end; checkpoint_every changes no bits)
ref() {  # np: echoes the reference dir, running it once
  local np=$1 d=$W/ref/np$1 t0
  if [[ ! -f $d.ok ]]; then
    mkdir -p "$W/ref"
    t0=$(date +%s%N)
    if [[ $np == 1 ]]; then
      run_fg 300 "$d" "$TRAIN" "${BASE[@]}" --steps $S --checkpoint_every 0 --threads 1 --out_dir "$d"
    else
      run_fg 300 "$d" mpirun -np "$np" "$TRAIN" "${BASE[@]}" --steps $S --checkpoint_every 0 --comm_timeout 5 --threads 1 --out_dir "$d"
    fi
    [[ $RC == 0 ]] || { echo "reference run with $np rank(s) failed (exit $RC): $(tail -3 "$d.err")" >&2; return 1; }
    [[ $np == 1 ]] && echo $((($(date +%s%N) - t0) / 1000000)) >"$d.ms"
    touch "$d.ok"
  fi
  echo "$d"
}

# ===============================================================================================================
# 1. kills: SIGKILL a checkpointing run at a random moment, then --resume auto to the end; exact vs the reference
if want kills; then
  section "kills"
  R1=$(ref 1)
  span=$(($(cat "$R1.ms") * 13 / 10))
  for i in $(seq "$KILLS"); do
    ce=$((i % 2 == 1 ? 1 : 2))
    ms=$((RANDOM * 32768 + RANDOM))
    ms=$((ms % span))
    out=$W/kills/k$i
    mkdir -p "$W/kills"
    run_bg 120 "$out.run" "$TRAIN" "${BASE[@]}" --steps $S --checkpoint_every $ce --keep_checkpoints 2 --threads 1 --out_dir "$out"
    pid=$(child "$BG")
    sleep_ms "$ms"
    [[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null
    wait "$BG" 2>/dev/null
    rc=$?
    name="kill $i at ${ms} ms (checkpoint_every $ce; killed after step $(last_step "$out"), complete: $(ckpt_steps "$out"))"
    WHY=""
    if [[ $rc != 137 && $rc != 0 ]]; then
      WHY="the run itself failed before the kill (exit $rc): $(first_err "$out.run.err")"
    else
      run_fg 120 "$out.res" "$TRAIN" "${BASE[@]}" --steps $S --checkpoint_every $ce --keep_checkpoints 2 --threads 1 --out_dir "$out" --resume auto
      judge_any "$out.res" "$RC"
      if [[ -z $WHY && $RC != 0 ]]; then WHY="--resume auto failed (exit $RC): $(first_err "$out.res.err")"; fi
      [[ -z $WHY ]] && exact "$R1" "$out"
      [[ -n $WHY && $RC == 0 ]] && WHY="resumed run not exact: $WHY"
    fi
    result kills "$name" "$WHY"
  done
fi

# ===============================================================================================================
# 2. ranks: under mpirun, SIGKILL or SIGSTOP one rank (or SIGKILL mpirun); the job must end, then resume exactly
if want ranks; then
  section "ranks"
  if [[ $QUICK == 1 ]]; then
    RCASES=("2 KILL 1" "2 STOP 1")
  else
    RCASES=("2 KILL 1" "2 KILL 0" "2 STOP 1" "2 STOP 0" "2 KILL mpirun" "4 KILL 2" "4 STOP 3" "4 KILL 0")
  fi
  for rcase in "${RCASES[@]}"; do
    read -r np sig rk <<<"$rcase"
    RN=$(ref "$np") || { result ranks "np $np $sig rank $rk" "reference run failed"; continue; }
    out=$W/ranks/np${np}_${sig}_$rk
    mkdir -p "$W/ranks"
    args=("${BASE[@]}" --steps $S --checkpoint_every 2 --keep_checkpoints 2 --comm_timeout 5 --threads 1 --out_dir "$out")
    at=$((3 + RANDOM % 8))
    tstart=$SECONDS
    run_bg 90 "$out.run" mpirun -np "$np" "$TRAIN" "${args[@]}"
    mp=$(child "$BG")
    name="np $np: SIG$sig $([[ $rk == mpirun ]] && echo mpirun || echo "rank $rk") after step $at"
    if ! wait_step "$out" "$at" "$BG" 60 || [[ -z $mp ]]; then
      wait "$BG" 2>/dev/null
      result ranks "$name" "could not catch the job at step $at (exit $?): $(first_err "$out.run.err")"
      continue
    fi
    ranks=$(pgrep -P "$mp" | tr '\n' ' ')
    if [[ $rk == mpirun ]]; then target=$mp; else target=$(rank_pid "$mp" "$rk"); fi
    t0=$SECONDS
    kill "-$sig" "$target"
    wait "$BG" 2>/dev/null
    rc=$?
    took=$((SECONDS - t0))
    for i in $(seq 150); do  # the ranks must be gone soon after the job ends
      left=""
      for r in $ranks; do alive "$r" && left+="$r "; done
      [[ -z $left ]] && break
      sleep 0.1
    done
    for r in $left; do kill -CONT "$r" 2>/dev/null; kill -KILL "$r" 2>/dev/null; done
    WHY=""
    if [[ $rc == 124 ]] || ((SECONDS - tstart >= 90)); then WHY="the job hung: still running ${took} s after the SIG$sig"
    elif [[ $rc == 0 ]]; then WHY="the job exited 0 after losing a rank"
    elif [[ -n $left ]]; then WHY="rank(s) $left still running 15 s after the job ended (exit $rc)"
    elif [[ $sig == STOP ]] && ! grep -q "did not complete within 5 s (--comm_timeout)" "$out.run.err"; then
      WHY="exit $rc without the watchdog's 'did not complete within 5 s' line: $(first_err "$out.run.err")"
    else
      c=$(grep -E -h -m1 'Segmentation fault|terminate called|double free|stack smashing' "$out.run.out" "$out.run.err")
      [[ -n $c ]] && WHY="crash: $c"
    fi
    before=$(ckpt_steps "$out")
    if [[ -z $WHY ]]; then
      run_fg 180 "$out.res" mpirun -np "$np" "$TRAIN" "${args[@]}" --resume auto
      judge_any "$out.res" "$RC"
      if [[ -z $WHY && $RC != 0 ]]; then WHY="--resume auto failed (exit $RC): $(first_err "$out.res.err")"; fi
      [[ -z $WHY ]] && exact "$RN" "$out"
      [[ -n $WHY && $RC == 0 ]] && WHY="resumed run not exact: $WHY"
    fi
    result ranks "$name (job ended in ${took} s, exit $rc; complete: $before)" "$WHY"
  done
fi

# ===============================================================================================================
# 3. disk full: a file size limit (EFBIG with SIGXFSZ ignored) and small tmpfs disks (ENOSPC) at several sizes
if want disk; then
  section "disk"
  R1=$(ref 1)
  dargs=("${BASE[@]}" --steps $S --checkpoint_every 8 --keep_checkpoints 2 --threads 1)
  disk_after() {  # out_dir log_prefix label rc: judge a run that met a full disk, then resume it without the limit
    local out=$1 pre=$2 label=$3 rc=$4 t before left
    before=$(ckpt_steps "$out")
    left=$(reap)
    WHY=""
    if [[ $rc == 0 ]]; then
      exact "$R1" "$out"
      [[ -n $WHY ]] && WHY="exit 0 under the limit, but: $WHY"
    else
      judge_fail "$pre.run" "$rc" "$out"
      [[ -n $WHY ]] && WHY="under the limit: $WHY"
    fi
    [[ -n $left ]] && WHY="${WHY:+$WHY; }left running after its end (ended here): $left"
    if [[ -z $WHY ]]; then
      t=$(leftover_tmp "$out")
      [[ -n $t ]] && WHY="left a temporary file ${t#"$out"/} behind"
    fi
    [[ -z $WHY ]] && { loads "$out"; }
    if [[ -z $WHY && $rc != 0 ]]; then
      run_fg 120 "$pre.res" "$TRAIN" "${dargs[@]}" --out_dir "$out" --resume auto
      judge_any "$pre.res" "$RC"
      if [[ -z $WHY && $RC != 0 ]]; then WHY="--resume auto without the limit failed (exit $RC): $(first_err "$pre.res.err")"; fi
      [[ -z $WHY ]] && exact "$R1" "$out"
      [[ -n $WHY && $RC == 0 ]] && WHY="resumed run not exact: $WHY"
    fi
    t=$(first_err "$pre.run.err" | sed -E 's#^error: ([^ ]*/)?([^/: ]+): .*#writing \2#' | cut -c1-60)
    result disk_full "$label (exit $rc${t:+, $t}; complete: $before)" "$WHY"
  }
  mkdir -p "$W/disk"
  # model.bin is 6,495,104 bytes (6343 KB), state_rank0.bin 12,989,810 (12686 KB); Open MPI's own start-up needs
  # files of some MB, so the smallest limits hit it before the trainer writes anything
  if [[ $QUICK == 1 ]]; then KBS=(64 6340 12000); else KBS=(1 64 4096 6340 6400 12000 12680 20000); fi
  for kb in "${KBS[@]}"; do
    out=$W/disk/ulimit$kb
    t0=$SECONDS
    (ulimit -f "$kb"; trap '' XFSZ; exec timeout -k 3 10 "$TRAIN" "${dargs[@]}" --out_dir "$out") >"$out.run.out" 2>"$out.run.err" </dev/null
    rc=$?
    FG_S=$((SECONDS - t0)) FG_LIMIT=10
    disk_after "$out" "$out" "ulimit -f $kb" $rc
  done
  # ENOSPC: a tmpfs of a few MB (or one nearly filled) under out_dir; afterwards it grows and --resume auto goes on
  probe=$W/disk/probe
  mkdir -p "$probe"
  if mount -t tmpfs -o size=1m tmpfs "$probe" 2>/dev/null; then
    umount "$probe"
    # "SIZE FREE_KB": a tmpfs of SIZE, filled up to FREE_KB KB when FREE_KB > 0 (tmpfs counts whole 4 KB pages: 2 KB
    # free is none, 4 KB one page: config.json fits, metrics.jsonl not; 8 KB: the metrics fit, a checkpoint not)
    if [[ $QUICK == 1 ]]; then TCASES=("25m 0" "64m 4"); else TCASES=("1m 0" "10m 0" "25m 0" "45m 0" "64m 2" "64m 4" "64m 8"); fi
    for tcase in "${TCASES[@]}"; do
      read -r size free_kb <<<"$tcase"
      mnt=$W/disk/tmpfs_${size}_$free_kb
      mkdir -p "$mnt"
      mount -t tmpfs -o "size=$size" tmpfs "$mnt" || { result disk_full "tmpfs $size" "mount failed"; continue; }
      MOUNTS+=("$mnt")
      label="tmpfs of $size"
      if [[ $free_kb != 0 ]]; then  # fill it up to free_kb KB
        avail=$(($(stat -f -c '%a * %S' "$mnt") / 1024))
        dd if=/dev/zero of="$mnt/filler" bs=1K count=$((avail - free_kb)) status=none 2>/dev/null
        label="tmpfs with $free_kb KB free"
      fi
      out=$mnt/run
      run_fg 30 "$mnt.log.run" "$TRAIN" "${dargs[@]}" --out_dir "$out"
      rc=$RC
      rm -f "$mnt/filler"
      mount -o remount,size=256m "$mnt"
      disk_after "$out" "$mnt.log" "$label" "$rc"
      umount "$mnt" 2>/dev/null
    done
  else
    echo "  (tmpfs cases skipped: cannot mount a tmpfs here)"
  fi
fi

# ===============================================================================================================
# 4. bad inputs: every one a non-zero exit with one error line naming the file or flag, no signal, no hang
if want bad; then
  section "bad inputs"
  B=$W/bad
  mkdir -p "$B/dir"
  R1=$(ref 1)
  MODEL=$R1/checkpoints/$(printf 'step_%08d' $S)/model.bin
  CK=$(dirname "$MODEL")
  SHARD=data/default/default_train_000001.bin
  "$PY" - "$B" "$SHARD" "$MODEL" <<'EOF'
import json, os, struct, sys
b, shard, model = sys.argv[1:4]
S = open(shard, "rb").read()
M = open(model, "rb").read()
def w(name, data): open(os.path.join(b, name), "wb").write(data)
def hdr(magic, version, n): return struct.pack("<256i", magic, version, n, *([0] * 253))
tok = S[1024:1024 + 2 * 4000]
w("empty.bin", b"")
w("shard_hdr_only.bin", hdr(20240520, 1, 4000))
w("shard_short.bin", S[:100])
w("shard_magic.bin", hdr(12345, 1, 4000) + tok)
w("shard_version.bin", hdr(20240520, 7, 4000) + tok)
w("shard_zero.bin", hdr(20240520, 1, 0))
w("shard_neg.bin", hdr(20240520, 1, -5) + tok)
w("shard_count_over.bin", hdr(20240520, 1, 4001) + tok)
w("shard_count_under.bin", hdr(20240520, 1, 3000) + tok)
w("shard_oov.bin", hdr(20240520, 1, 4000) + struct.pack("<H", 60000) * 4000)
w("shard_tiny.bin", hdr(20240520, 1, 10) + tok[:20])
w("shard_odd.bin", hdr(20240520, 1, 4000) + tok + b"x")
w("model_hdr_only.bin", M[:1024])
w("model_half.bin", M[:len(M) // 2])
w("model_magic.bin", struct.pack("<i", 1) + M[4:])
w("model_version.bin", M[:4] + struct.pack("<i", 99) + M[8:])
w("model_layers.bin", M[:16] + struct.pack("<i", 2) + M[20:])
w("model_huge.bin", M[:16] + struct.pack("<i", 2**31 - 1) + M[20:])
w("model_zero_c.bin", M[:24] + struct.pack("<i", 0) + M[28:])
w("model_extra.bin", M + b"\0" * 4096)
w("tok_magic.bin", struct.pack("<256i", 1, 2, 50257, *([0] * 253)))
w("not_json.json", b"{")
w("array.json", b"[1, 2]")
w("string.json", b'"lr"')
w("trailing.json", b'{"steps": 2} x')
w("bom.json", b'\xef\xbb\xbf{"steps": 2}')
w("binary.json", bytes(range(256)))
for name, body in [("unknown_key", {"stepz": 2}), ("lr_string", {"lr": "abc"}), ("lr_numstring", {"lr": "1e-3"}),
                   ("steps_float", {"steps": 1.5}), ("steps_neg", {"steps": -5}), ("lr_neg", {"lr": -1}),
                   ("lr_nanstr", {"lr": "NaN"}), ("batch_zero", {"batch_size": 0}), ("heads_3", {"num_heads": 3}),
                   ("seq_over", {"seq_len": 1000}), ("steps_1e30", {"steps": 1e30}), ("opt_sgd", {"optimizer": "sgd"}),
                   ("shuffle_yes", {"shuffle": "yes"}), ("steps_null", {"steps": None}),
                   ("nested", {"model": {"num_layers": 1}}), ("lr_true", {"lr": True}), ("lr_list", {"lr": [1]}),
                   ("threads_neg", {"threads": -1}), ("channels_huge", {"channels": 2**40}),
                   ("warmup_neg", {"warmup_steps": -1}), ("keep_neg", {"keep_checkpoints": -3}),
                   ("val_every_neg", {"val_every": -1}), ("empty_key", {"": 1}), ("config_key", {"config": "x.json"})]:
    w(name + ".json", json.dumps(body).encode())
w("steps_1e400.json", b'{"steps": 1e400}')
w("lr_nan_literal.json", b'{"lr": NaN}')
w("dup_key.json", b'{"steps": 2, "steps": 3}')
w("doc.txt", b"Hello there. This is a small document for prepro.\n")
w("doc2.txt", b"And a second one, so that the validation split has a document of its own.\n")
w("bad.jsonl", b'{"text": "ok"}\n{not json}\n')
w("nokey.jsonl", b'{"body": "no text key"}\n')
w("wrongtype.jsonl", b'{"text": 5}\n')
w("fake.gz", b"this is not gzip")
w("fake.jsonl.zst", b"this is not zstd")
w("trunc.txt.gz", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03")
w("encoder_bad.json", b'{"a": 1')
w("encoder_list.json", b'[1,2,3]')
w("vocab_bad.bpe", b"#version: 0.2\nnot a merge line with three parts\n")
EOF
  # a checkpoint's copies with one thing wrong
  mkck() { rm -rf "$B/$1"; cp -r "$CK" "$B/$1"; }
  strip_marker() { "$PY" -c "import json,sys; p=sys.argv[1]; m=json.load(open(p)); m.pop('files',None); open(p,'w').write(json.dumps(m))" "$B/$1/COMPLETE"; }
  mkck ck_nomarker; rm "$B/ck_nomarker/COMPLETE"
  mkck ck_emptymarker; : >"$B/ck_emptymarker/COMPLETE"
  mkck ck_garbagemarker; echo 'garbage {' >"$B/ck_garbagemarker/COMPLETE"
  mkck ck_state_trunc; truncate -s 1000 "$B/ck_state_trunc/state_rank0.bin"
  mkck ck_state_missing; rm "$B/ck_state_missing/state_rank0.bin"
  mkck ck_model_missing; rm "$B/ck_model_missing/model.bin"
  mkck ck_state_empty_nosum; : >"$B/ck_state_empty_nosum/state_rank0.bin"; strip_marker ck_state_empty_nosum
  mkck ck_state_trunc_nosum; truncate -s 5000 "$B/ck_state_trunc_nosum/state_rank0.bin"; strip_marker ck_state_trunc_nosum
  mkck ck_state_magic_nosum; printf 'XXXX' | dd of="$B/ck_state_magic_nosum/state_rank0.bin" conv=notrunc status=none; strip_marker ck_state_magic_nosum
  mkck ck_model_trunc_nosum; truncate -s 100000 "$B/ck_model_trunc_nosum/model.bin"; strip_marker ck_model_trunc_nosum
  mkck ck_state_dir; rm "$B/ck_state_dir/state_rank0.bin"; mkdir "$B/ck_state_dir/state_rank0.bin"
  mkck ck_marker_step; sed -i 's/"step":24/"step":23/' "$B/ck_marker_step/COMPLETE"
  mkck ck_marker_world; sed -i 's/"world_size":1/"world_size":2/' "$B/ck_marker_world/COMPLETE"
  : >"$B/outfile"
  mkdir -p "$B/out_metrics_dir/metrics.jsonl" "$B/out_config_dir/config.json" "$B/out_ck_file"
  : >"$B/out_ck_file/checkpoints"
  N=0
  bt() {  # needle mode(fail|any) args...: a train_gpt_cpu case
    local needle=$1 mode=$2
    shift 2
    N=$((N + 1))
    [[ $QUICK == 1 && $((N % 4)) != 1 ]] && return
    local pre=$B/case$N
    run_fg 30 "$pre" "$TRAIN" "${BASE[@]}" --steps 2 --threads 1 --out_dir "$B/o$N" "$@"
    if [[ $mode == fail ]]; then judge_fail "$pre" "$RC" "$needle"; else judge_any "$pre" "$RC"; fi
    result bad_inputs "train_gpt_cpu $*" "$WHY"
  }
  tool() {  # needle mode program args...: a sample_gpt / eval_gpt / prepro_gpt2 case
    local needle=$1 mode=$2 prog=$3
    shift 3
    N=$((N + 1))
    [[ $QUICK == 1 && $((N % 4)) != 1 ]] && return
    local pre=$B/case$N
    run_fg 30 "$pre" "$prog" "$@"
    if [[ $mode == fail ]]; then judge_fail "$pre" "$RC" "$needle"; else judge_any "$pre" "$RC"; fi
    result bad_inputs "${prog##*/} $*" "$WHY"
  }
  # --- train_gpt_cpu: data files
  bt /nonexistent.bin fail --train_data "$B/nonexistent.bin"
  bt "$B/dir" fail --train_data "$B/dir"
  bt empty.bin fail --train_data "$B/empty.bin"
  for f in shard_hdr_only shard_short shard_magic shard_version shard_zero shard_neg shard_count_over shard_count_under shard_oov shard_tiny shard_odd; do
    bt "$f.bin" fail --train_data "$B/$f.bin"
  done
  bt nonexistent_val fail --val_data "$B/nonexistent_val.bin"
  bt "$B/dir" fail --val_data "$B/dir"
  bt empty.bin fail --val_data "$B/empty.bin"
  bt shard_magic.bin fail --val_data "$B/shard_magic.bin"
  bt shard_oov.bin fail --val_data "$B/shard_oov.bin"
  bt nonexistent_tok fail --tokenizer "$B/nonexistent_tok.bin" --sample_every 1 --sample_tokens 2
  bt empty.bin fail --tokenizer "$B/empty.bin" --sample_every 1 --sample_tokens 2
  bt tok_magic.bin fail --tokenizer "$B/tok_magic.bin" --sample_every 1 --sample_tokens 2
  bt shard_magic.bin fail --choices "$B/shard_magic.bin"
  # --- model files for --init_from
  bt nonexistent_model fail --init_from "$B/nonexistent_model.bin"
  bt "$B/dir" fail --init_from "$B/dir"
  bt empty.bin fail --init_from "$B/empty.bin"
  for f in model_hdr_only model_half model_magic model_version model_layers model_huge model_zero_c model_extra; do
    bt "$f.bin" fail --init_from "$B/$f.bin"
  done
  bt "$SHARD" fail --init_from "$SHARD"
  # --- checkpoints for --resume
  bt nonexistent_ck fail --resume "$B/nonexistent_ck" --steps 26
  bt model.bin fail --resume "$MODEL" --steps 26
  for c in ck_nomarker ck_emptymarker ck_garbagemarker; do bt "$c" fail --resume "$B/$c" --steps 26; done
  bt state_rank0.bin fail --resume "$B/ck_state_trunc" --steps 26
  bt state_rank0.bin fail --resume "$B/ck_state_missing" --steps 26
  bt model.bin fail --resume "$B/ck_model_missing" --steps 26
  bt state_rank0.bin fail --resume "$B/ck_state_empty_nosum" --steps 26
  bt state_rank0.bin fail --resume "$B/ck_state_trunc_nosum" --steps 26
  bt state_rank0.bin fail --resume "$B/ck_state_magic_nosum" --steps 26
  bt model.bin fail --resume "$B/ck_model_trunc_nosum" --steps 26
  bt state_rank0.bin fail --resume "$B/ck_state_dir" --steps 26
  bt ck_marker_step fail --resume "$B/ck_marker_step" --steps 26
  bt ck_marker_world fail --resume "$B/ck_marker_world" --steps 26
  bt channels fail --resume "$CK" --channels 64 --steps 26
  bt "$B/outfile" fail --out_dir "$B/outfile"
  bt "$B/outfile" fail --out_dir "$B/outfile/sub"
  bt metrics.jsonl fail --out_dir "$B/out_metrics_dir"
  bt config.json fail --out_dir "$B/out_config_dir"
  bt checkpoints fail --out_dir "$B/out_ck_file" --checkpoint_every 1
  # --- config files
  bt nonexistent.json fail --config "$B/nonexistent.json"
  bt "$B/dir" fail --config "$B/dir"
  bt empty.bin fail --config "$B/empty.bin"
  for f in not_json array string trailing binary unknown_key lr_string lr_numstring steps_float steps_neg lr_neg lr_nanstr \
           batch_zero heads_3 seq_over steps_1e30 opt_sgd shuffle_yes steps_null nested lr_true lr_list threads_neg \
           channels_huge warmup_neg keep_neg val_every_neg empty_key config_key steps_1e400 lr_nan_literal; do
    bt "$f.json" fail --config "$B/$f.json"
  done
  bt - any --config "$B/bom.json"
  bt - any --config "$B/dup_key.json"
  # --- flags
  bt --bogus fail --bogus 1
  bt --lr fail --lr
  bt --lr fail --lr --steps
  for v in nan inf -inf 0x10 " 1" +1 1e999 "" 1,5 1e-3x; do bt --lr fail --lr "$v"; done
  for v in 99999999999999999999 -1 1.5 0 abc; do bt --steps fail --steps "$v"; done
  bt --batch_size fail --batch_size 0
  bt batch_size fail --batch_size 100000000
  bt --seq_len fail --seq_len 0
  bt seq_len fail --seq_len 33
  bt --threads fail --threads -1
  bt --threads fail --threads 5000
  bt num_layers fail --num_layers 0
  bt channels fail --channels 33
  bt max_seq_len fail --max_seq_len 2147483647
  bt vocab_size fail --vocab_size 0
  bt padded_vocab_size fail --padded_vocab_size 10
  bt --optimizer fail --optimizer sgd
  bt --lr_schedule fail --lr_schedule foo
  bt total_batch_size fail --total_batch_size 100
  bt --warmup_steps fail --warmup_steps -1
  bt --keep_checkpoints fail --keep_checkpoints -1
  bt --comm_timeout fail --comm_timeout -1
  bt --checkpoint_every fail --checkpoint_every -2
  bt --demo_topk fail --optimizer demo --demo_topk 0
  bt --dry_run fail --dry_run=maybe
  bt --resume fail --resume
  bt foo fail foo
  bt -x fail -x
  bt -- fail --
  bt -- fail --=5
  bt - any --steps 2 --steps 3
  bt - any --config configs/tiny.json --config configs/tiny.json --num_layers 1 --channels 32 --num_heads 2 --max_seq_len 32
  # --- sample_gpt
  tool --model fail "$SAMPLE"
  tool nonexistent fail "$SAMPLE" --model "$B/nonexistent.bin"
  tool "$B/dir" fail "$SAMPLE" --model "$B/dir"
  tool empty.bin fail "$SAMPLE" --model "$B/empty.bin"
  for f in model_hdr_only model_half model_magic model_version model_huge model_zero_c; do tool "$f.bin" fail "$SAMPLE" --model "$B/$f.bin"; done
  tool default_train_000001.bin fail "$SAMPLE" --model "$SHARD"
  tool state_rank0.bin fail "$SAMPLE" --model "$CK/state_rank0.bin"
  tool model.bin fail "$SAMPLE" --model "$B/ck_model_missing"
  tool nonexistent fail "$SAMPLE" --model "$MODEL" --encoder "$B/nonexistent.json"
  tool encoder_bad.json fail "$SAMPLE" --model "$MODEL" --encoder "$B/encoder_bad.json"
  tool encoder_list.json fail "$SAMPLE" --model "$MODEL" --encoder "$B/encoder_list.json"
  tool nonexistent fail "$SAMPLE" --model "$MODEL" --vocab "$B/nonexistent.bpe"
  tool vocab_bad.bpe fail "$SAMPLE" --model "$MODEL" --vocab "$B/vocab_bad.bpe"
  tool --tokens fail "$SAMPLE" --model "$MODEL" --tokens -1
  tool --tokens fail "$SAMPLE" --model "$MODEL" --tokens 99999999999
  tool --temperature fail "$SAMPLE" --model "$MODEL" --temperature nan
  tool temperature fail "$SAMPLE" --model "$MODEL" --temperature -1
  tool top_p fail "$SAMPLE" --model "$MODEL" --top_p 2
  tool --top_k fail "$SAMPLE" --model "$MODEL" --top_k -1
  tool --seed fail "$SAMPLE" --model "$MODEL" --seed -1
  tool nonexistent fail "$SAMPLE" --model "$MODEL" --prompt_file "$B/nonexistent.txt"
  tool "$B/dir" fail "$SAMPLE" --model "$MODEL" --prompt_file "$B/dir"
  tool --prompt fail "$SAMPLE" --model "$MODEL" --prompt hi --prompt_file "$B/doc.txt"
  tool --bogus fail "$SAMPLE" --model "$MODEL" --bogus
  tool --tokens fail "$SAMPLE" --model "$MODEL" --tokens
  tool stray fail "$SAMPLE" --model "$MODEL" stray
  tool --threads fail "$SAMPLE" --model "$MODEL" --threads 99999
  tool --json fail "$SAMPLE" --model "$MODEL" --json=2
  # --- eval_gpt
  tool --model fail "$EVAL"
  tool nonexistent fail "$EVAL" --model "$B/nonexistent.bin"
  tool model_half.bin fail "$EVAL" --model "$B/model_half.bin"
  tool nonexistent fail "$EVAL" --model "$MODEL" --data "$B/nonexistent.bin"
  tool "$B/dir" fail "$EVAL" --model "$MODEL" --data "$B/dir"
  for f in empty shard_hdr_only shard_magic shard_version shard_oov shard_tiny; do tool "$f.bin" fail "$EVAL" --model "$MODEL" --data "$B/$f.bin"; done
  tool seq_len fail "$EVAL" --model "$MODEL" --seq_len 1000
  tool batches fail "$EVAL" --model "$MODEL" --batches 99999999
  tool --batch_size fail "$EVAL" --model "$MODEL" --batch_size 0
  tool nonexistent fail "$EVAL" --model "$MODEL" --choices "$B/nonexistent.bin"
  tool shard_magic.bin fail "$EVAL" --model "$MODEL" --choices "$B/shard_magic.bin"
  tool --bogus fail "$EVAL" --model "$MODEL" --bogus 1
  tool --batches fail "$EVAL" --model "$MODEL" --batches
  # --- build/prepro_gpt2
  PP=(--encoder "$ENCODER" --vocab "$VOCAB" --name t)
  tool --encoder fail "$PREPRO"
  tool nonexistent fail "$PREPRO" --encoder "$B/nonexistent.json" --vocab "$VOCAB" --out-dir "$B/pp1" --name t "$B/doc.txt" "$B/doc2.txt"
  tool nonexistent fail "$PREPRO" --encoder "$ENCODER" --vocab "$B/nonexistent.bpe" --out-dir "$B/pp2" --name t "$B/doc.txt" "$B/doc2.txt"
  tool encoder_bad.json fail "$PREPRO" --encoder "$B/encoder_bad.json" --vocab "$VOCAB" --out-dir "$B/pp3" --name t "$B/doc.txt" "$B/doc2.txt"
  tool vocab_bad.bpe fail "$PREPRO" --encoder "$ENCODER" --vocab "$B/vocab_bad.bpe" --out-dir "$B/pp3b" --name t "$B/doc.txt" "$B/doc2.txt"
  tool outfile fail "$PREPRO" "${PP[@]}" --out-dir "$B/outfile" "$B/doc.txt" "$B/doc2.txt"
  tool --name fail "$PREPRO" --encoder "$ENCODER" --vocab "$VOCAB" --out-dir "$B/pp4" --name a/b "$B/doc.txt" "$B/doc2.txt"
  tool nonexistent fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp5" "$B/nonexistent.txt"
  tool "$B/dir" fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp6" "$B/dir"
  tool --shard-tokens fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp7" --shard-tokens 0 "$B/doc.txt" "$B/doc2.txt"
  tool --shard-tokens fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp8" --shard-tokens abc "$B/doc.txt" "$B/doc2.txt"
  tool --threads fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp9" --threads 0 "$B/doc.txt" "$B/doc2.txt"
  tool --bogus fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp10" --bogus "$B/doc.txt" "$B/doc2.txt"
  tool nonexistent fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp11" --file-list "$B/nonexistent.list"
  tool bad.jsonl fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp12" "$B/doc.txt" "$B/bad.jsonl"
  tool nokey.jsonl fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp13" "$B/doc.txt" "$B/nokey.jsonl"
  tool wrongtype.jsonl fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp14" "$B/doc.txt" "$B/wrongtype.jsonl"
  tool fake.gz fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp15" "$B/doc.txt" "$B/fake.gz"
  tool fake.jsonl.zst fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp16" "$B/doc.txt" "$B/fake.jsonl.zst"
  tool trunc.txt.gz fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp17" "$B/doc.txt" "$B/trunc.txt.gz"
  tool --val-tokens fail "$PREPRO" "${PP[@]}" --out-dir "$B/pp18" --val-tokens 100000000 "$B/doc.txt" "$B/doc2.txt"
  tool - any "$PREPRO" "${PP[@]}" --out-dir "$B/pp19" "$B/empty.bin" "$B/doc.txt" "$B/doc2.txt"
  tool --out-dir fail "$PREPRO" "${PP[@]}" "$B/doc.txt" --out-dir
fi

# ===============================================================================================================
# 5. fuzz: mutated model files, checkpoints, token shards and config JSON; each succeeds or fails cleanly
if want fuzz; then
  section "fuzz"
  F=$W/fuzz
  mkdir -p "$F"
  if [[ $QUICK == 1 ]]; then NM=10 NCK=12 NSH=10 NCF=8; else NM=35 NCK=45 NSH=40 NCF=30; fi
  # sources: a 4-step run with checkpoints at 2 and 4, a shard of 4000 tokens, a config
  run_fg 120 "$F/src" "$TRAIN" "${BASE[@]}" --steps 4 --checkpoint_every 2 --keep_checkpoints 0 --threads 1 --out_dir "$F/src"
  [[ $RC == 0 ]] || echo "  fuzz source run failed: $(first_err "$F/src.err")"
  CK2=$F/src/checkpoints/step_00000002
  "$PY" -c "
import struct, sys
d = open('data/default/default_train_000001.bin', 'rb').read()
open(sys.argv[1], 'wb').write(struct.pack('<256i', 20240520, 1, 4000, *([0] * 253)) + d[1024:1024 + 8000])" "$F/shard.bin"
  cat >"$F/config.json" <<'EOF'
{"_comment": "fuzz source", "num_layers": 1, "num_heads": 2, "channels": 32, "max_seq_len": 32, "batch_size": 2,
 "seq_len": 32, "steps": 2, "lr": 0.001, "warmup_steps": 1, "val_every": 0, "val_batches": 1, "optimizer": "adamw",
 "checkpoint_every": -1, "train_data": "data/default/default_train_*.bin", "shuffle": true, "seed": 1337}
EOF
  fuzz_set() {  # kind src n seed label: runs each mutant through its reader
    local kind=$1 src=$2 n=$3 seed=$4 label=$5 name what changed pre
    "$PY" "$W/fuzz.py" "$kind" "$src" "$F/$label" "$n" "$seed" >"$F/$label.list" || { result fuzz "$label generator" "fuzz.py failed"; return; }
    while IFS=$'\t' read -r name what changed; do
      pre=$F/$label/$name.case
      case $label in
        model) if ((10#$name % 2 == 0)); then run_fg 30 "$pre" "$SAMPLE" --model "$F/model/$name" --tokens 2 --threads 1
               else run_fg 30 "$pre" "$EVAL" --model "$F/model/$name" --data data/default/default_val_000000.bin --batches 2 --seq_len 32 --batch_size 2 --threads 1; fi ;;
        ckpt) run_fg 60 "$pre" "$TRAIN" "${BASE[@]}" --steps 4 --checkpoint_every -1 --threads 1 --resume "$F/ckpt/$name" --out_dir "$F/ckpt/o$name" ;;
        shard) run_fg 60 "$pre" "$TRAIN" "${BASE[@]}" --steps 2 --checkpoint_every -1 --threads 1 --train_data "$F/shard/$name" --val_data "" --out_dir "$F/shard/o$name" ;;
        config) run_fg 30 "$pre" "$TRAIN" --config "$F/config/$name" --threads 1 --out_dir "$F/config/o$name" --dry_run ;;
      esac
      judge_any "$pre" "$RC"
      if [[ -z $WHY && $RC == 0 && $label == ckpt && $changed == 1 && $what == *"checksummed marker"* && $what != COMPLETE* ]]; then
        WHY="resumed from a damaged file that its checksummed marker should have refused"
      fi
      result fuzz "$label $name ($what)" "$WHY"
    done <"$F/$label.list"
  }
  fuzz_set bin:1024 "$CK2/model.bin" "$NM" 101 model
  fuzz_set ckpt "$CK2" "$NCK" 202 ckpt
  fuzz_set bin:1024 "$F/shard.bin" "$NSH" 303 shard
  fuzz_set text "$F/config.json" "$NCF" 404 config
fi

# ===============================================================================================================
# 6. divergence: absurd learning rates; a clear error and exit 3, and every complete checkpoint left loads
if want diverge; then
  section "divergence"
  if [[ $QUICK == 1 ]]; then DCASES=("adamw 1e10" "adamw 3e38"); else DCASES=("adamw 1e3" "adamw 1e10" "adamw 3e38" "demo 1e3" "demo 1e10" "demo 3e38"); fi
  mkdir -p "$W/div"
  for dcase in "${DCASES[@]}"; do
    read -r opt lr <<<"$dcase"
    out=$W/div/${opt}_$lr
    dv=("${BASE[@]}" --optimizer "$opt" --steps 12 --warmup_steps 0 --checkpoint_every 1 --keep_checkpoints 2 --threads 1 --out_dir "$out")
    run_fg 60 "$out.run" "$TRAIN" "${dv[@]}" --lr "$lr"
    rc=$RC
    WHY=""
    if [[ $rc == 0 ]]; then
      grep -q '"loss":null\|"grad_norm":null' "$out/metrics.jsonl" && WHY="exit 0 with non-finite losses in metrics.jsonl"
    else
      judge_fail "$out.run" "$rc" diverged
      [[ -z $WHY && $rc != 3 ]] && WHY="exit $rc instead of 3: $(first_err "$out.run.err")"
    fi
    [[ -z $WHY ]] && loads "$out"
    result divergence "$opt --lr $lr (exit $rc after step $(last_step "$out"); complete: $(ckpt_steps "$out"))" "$WHY"
    # the documented way on: --resume auto with a lower --lr starts from the last complete checkpoint
    if [[ $rc != 0 ]]; then
      run_fg 60 "$out.res" "$TRAIN" "${dv[@]}" --lr 1e-4 --resume auto
      judge_any "$out.res" "$RC"
      [[ -z $WHY && $RC != 0 && $RC != 3 ]] && WHY="cannot continue (exit $RC): $(first_err "$out.res.err")"
      result divergence "$opt --lr $lr, then --resume auto --lr 1e-4 (exit $RC)" "$WHY"
    fi
  done
fi

# ===============================================================================================================
# 7. stop signals: SIGTERM/SIGINT/SIGUSR1 stop at a step with a checkpoint (exit 4); resume auto continues exactly
if want stop; then
  section "stop signals"
  R1=$(ref 1)
  mkdir -p "$W/stop"
  # signal(s) (a,b: two quickly), ranks, checkpoint_every, target (pid|mpirun|rank1), how ("step" = after step 3-8,
  # or a delay in ms)
  if [[ $QUICK == 1 ]]; then
    SCASES=("TERM 1 0 pid step" "USR1 1 1 pid step" "USR1 2 2 mpirun step")
  else
    SCASES=("TERM 1 0 pid step" "INT 1 3 pid step" "USR1 1 1 pid step" "TERM,TERM 1 2 pid step" "INT,INT 1 1 pid step"
            "USR1 1 2 pid 30" "HUP 1 2 pid step" "USR1 2 2 mpirun step" "USR1 2 2 rank1 step" "TERM 2 2 mpirun step")
  fi
  for scase in "${SCASES[@]}"; do
    read -r sigs np ce target how <<<"$scase"
    RN=$(ref "$np") || { result stop_signals "$scase" "reference run failed"; continue; }
    out=$W/stop/${sigs/,/_}_${np}_${target}_$how
    args=("${BASE[@]}" --steps $S --checkpoint_every "$ce" --keep_checkpoints 2 --threads 1 --out_dir "$out")
    if [[ $np == 1 ]]; then run_bg 90 "$out.run" "$TRAIN" "${args[@]}"
    else run_bg 90 "$out.run" mpirun -np "$np" "$TRAIN" "${args[@]}" --comm_timeout 5; fi
    pid=$(child "$BG")
    at=$((3 + RANDOM % 6))
    if [[ $how == step ]]; then wait_step "$out" "$at" "$BG" 60; else sleep_ms "$how"; at="${how}ms"; fi
    case $target in
      pid | mpirun) tp=$pid ;;
      rank1) tp=$(rank_pid "$pid" 1) ;;
    esac
    IFS=, read -r -a sl <<<"$sigs"
    kill "-${sl[0]}" "$tp"
    [[ ${#sl[@]} -gt 1 ]] && { sleep 0.02; kill "-${sl[1]}" "$tp" 2>/dev/null; }
    wait "$BG" 2>/dev/null
    rc=$?
    name="SIG$sigs to $([[ $target == pid ]] && echo "the trainer" || echo "$target of $np ranks") at ${at} (checkpoint_every $ce)"
    stopped=$(last_step "$out")
    WHY=""
    handled=0
    [[ ${sl[0]} == TERM || ${sl[0]} == INT || ${sl[0]} == USR1 ]] && [[ ${#sl[@]} == 1 && $how == step ]] && handled=1
    [[ $np != 1 && ${sl[0]} == TERM ]] && handled=0  # mpirun's own SIGTERM kills the job (documented)
    if [[ $rc == 124 || ($rc == 137 && $handled == 1) ]]; then WHY="hang: did not stop"
    elif [[ $handled == 1 ]]; then
      ck=$out/checkpoints/$(printf 'step_%08d' "$stopped")
      if [[ $rc != 4 ]]; then WHY="exit $rc instead of 4: $(first_err "$out.run.err")"
      elif ! grep -q "stopped after step $stopped of $S on " "$out.run.out"; then WHY="no 'stopped after step $stopped of $S on ...' line"
      elif [[ ! -f $ck/COMPLETE ]]; then WHY="no complete checkpoint of step $stopped"
      elif [[ -n $(errlines "$out.run.err" | grep -v -E '^\[vm:|^---|Read -1') && $np == 1 ]]; then WHY="stderr: $(errlines "$out.run.err" | head -1)"
      fi
    else
      c=$(crash "$out.run.out" "$out.run.err")
      [[ -n $c ]] && WHY="crash: $c"
    fi
    if [[ -z $WHY ]]; then
      if [[ $np == 1 ]]; then run_fg 120 "$out.res" "$TRAIN" "${args[@]}" --resume auto
      else run_fg 180 "$out.res" mpirun -np "$np" "$TRAIN" "${args[@]}" --comm_timeout 5 --resume auto; fi
      judge_any "$out.res" "$RC"
      if [[ -z $WHY && $RC != 0 ]]; then WHY="--resume auto failed (exit $RC): $(first_err "$out.res.err")"; fi
      [[ -z $WHY ]] && exact "$RN" "$out"
      [[ -n $WHY && $RC == 0 ]] && WHY="resumed run not exact: $WHY"
    fi
    result stop_signals "$name: exit $rc after step $stopped" "$WHY"
  done
fi

# ===============================================================================================================
# 8. two trainers on one out_dir: the second must be refused naming the holder; the first must finish intact
if want two; then
  section "two trainers"
  R1=$(ref 1)
  mkdir -p "$W/two"
  if [[ $QUICK == 1 ]]; then TWCASES=(resume); else TWCASES=(resume overwrite symlink fresh_other_steps); fi
  for how in "${TWCASES[@]}"; do
    out=$W/two/$how
    args=("${BASE[@]}" --steps $S --checkpoint_every 2 --keep_checkpoints 2 --threads 1)
    run_bg 120 "$out.a" "$TRAIN" "${args[@]}" --out_dir "$out"
    apid=$(child "$BG")
    abg=$BG
    wait_step "$out" 3 "$abg" 60
    case $how in
      resume) run_fg 60 "$out.b" "$TRAIN" "${args[@]}" --out_dir "$out" --resume auto ;;
      overwrite) run_fg 60 "$out.b" "$TRAIN" "${args[@]}" --out_dir "$out" --overwrite ;;
      symlink) ln -s "$out" "$out.link"; run_fg 60 "$out.b" "$TRAIN" "${args[@]}" --out_dir "$out.link/" --resume auto ;;
      fresh_other_steps) run_fg 60 "$out.b" "$TRAIN" "${args[@]}" --out_dir "$out" --steps 40 --resume auto ;;
    esac
    brc=$RC
    wait "$abg" 2>/dev/null
    arc=$?
    WHY=""
    judge_fail "$out.b" "$brc"
    line=$(errlines "$out.b.err" | head -1)
    re='lock|running|in use|held'
    if [[ $brc == 0 ]]; then WHY="the second trainer was not refused: it ran to exit 0 alongside the first"
    elif [[ -n $WHY ]]; then WHY="the second trainer: $WHY"
    elif [[ $line != *"$apid"* && ! $line =~ $re ]]; then
      if grep -q '^step ' "$out.b.out"; then
        WHY="the second trainer was not refused: it trained alongside the first, then failed: $line"
      else
        WHY="refused, but without naming the holder (pid $apid): $line"
      fi
    fi
    if [[ $arc != 0 ]]; then WHY+="${WHY:+; }the first run failed (exit $arc): $(first_err "$out.a.err")"
    else
      w0=$WHY
      exact "$R1" "$out"
      [[ -n $WHY ]] && WHY="${w0:+$w0; }the first run's result is not the reference's: $WHY" || WHY=$w0
    fi
    result two_trainers "second trainer ($how) while the first runs (second exit $brc, first exit $arc)" "$WHY"
  done
fi

# ===============================================================================================================
# 9. requeue: a run killed before its first checkpoint completes; --resume auto with the same config must start
if want requeue; then
  section "requeue"
  R1=$(ref 1)
  mkdir -p "$W/requeue"
  if [[ $QUICK == 1 ]]; then QCASES=("KILL 1 1000 step" "TERM 1 1000 step"); else
    QCASES=("KILL 1 1000 step" "KILL 1 1000 80" "KILL 1 12 first_ckpt" "TERM 1 1000 step" "KILL 2 1000 step"); fi
  for qcase in "${QCASES[@]}"; do
    read -r sig np ce how <<<"$qcase"
    RN=$(ref "$np") || { result requeue "$qcase" "reference run failed"; continue; }
    out=$W/requeue/${sig}_${np}_$how
    args=("${BASE[@]}" --steps $S --checkpoint_every "$ce" --keep_checkpoints 2 --threads 1 --out_dir "$out")
    if [[ $np == 1 ]]; then run_bg 90 "$out.run" "$TRAIN" "${args[@]}"
    else run_bg 90 "$out.run" mpirun -np "$np" "$TRAIN" "${args[@]}" --comm_timeout 5; fi
    pid=$(child "$BG")
    tp=$pid
    case $how in
      step) wait_step "$out" 2 "$BG" 60 ;;
      first_ckpt)  # while step 12's checkpoint is being written
        t=$((SECONDS + 60))
        while ((SECONDS < t)) && kill -0 "$BG" 2>/dev/null; do
          [[ -d $out/checkpoints/step_00000012 && ! -f $out/checkpoints/step_00000012/COMPLETE ]] && break
          sleep 0.002
        done ;;
      *) sleep_ms "$how" ;;
    esac
    [[ $np != 1 ]] && tp=$(rank_pid "$pid" 1)
    kill "-$sig" "$tp"
    wait "$BG" 2>/dev/null
    rc=$?
    name="SIG$sig ${how/step/after step 2} (${np} rank(s), checkpoint_every $ce; exit $rc after step $(last_step "$out"), complete: $(ckpt_steps "$out"))"
    if [[ $np == 1 ]]; then run_fg 120 "$out.res" "$TRAIN" "${args[@]}" --resume auto
    else run_fg 180 "$out.res" mpirun -np "$np" "$TRAIN" "${args[@]}" --comm_timeout 5 --resume auto; fi
    judge_any "$out.res" "$RC"
    if [[ -z $WHY && $RC != 0 ]]; then WHY="--resume auto did not start (exit $RC): $(first_err "$out.res.err")"; fi
    [[ -z $WHY ]] && exact "$RN" "$out"
    [[ -n $WHY && $RC == 0 ]] && WHY="requeued run not exact: $WHY"
    result requeue "$name" "$WHY"
  done
fi

# ===============================================================================================================
left=$(reap)
[[ -n $left ]] && echo "  note: ended processes still running from the category before: $left"
echo
echo "== results ($((SECONDS - START)) s$([[ $QUICK == 1 ]] && echo ", QUICK"))"
tc=0 th=0 tf=0
for c in "${CATS[@]}"; do
  echo "$c: ${NC[$c]} cases, ${NH[$c]} held, ${NF[$c]} failed"
  tc=$((tc + NC[$c])) th=$((th + NH[$c])) tf=$((tf + NF[$c]))
done
if ((tf > 0)); then
  echo "failed cases:"
  for f in "${FAILS[@]}"; do echo "  $f"; done
fi
echo "total: $tc cases, $th held, $tf failed in $((SECONDS - START)) s"
((tf == 0))
