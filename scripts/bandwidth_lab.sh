#!/usr/bin/env bash
# Emulated hosts with slow links, for measuring DeMo vs AdamW-DDP under limited bandwidth on one machine.
# Creates N network namespaces ("hosts", one veth eth0 each, 10.77.0.1..N/24) whose peers sit on a bridge in
# a separate switch namespace, limits every link to RATE in both directions with a tbf qdisc (host egress =
# upload, switch-port egress = download), with --delay replaces the bridge by build/lab_delay_switch (a
# learning switch in user space that holds every frame for the delay: this kernel has no netem), runs a
# command with `lab-mpirun` on its PATH (mpirun inside host 0 with a hostfile of the hosts, an rsh agent that
# maps a host to `ip netns exec`, and the MCA flags that keep MPI on the emulated network), and always removes
# everything it created: namespaces (with their links and qdiscs), temp files (incl. Open MPI's session dirs)
# and processes, on success, failure, Ctrl-C or SIGTERM.
# Nothing is changed in the root namespace; namespace names carry a per-invocation prefix (bwl<PID>).
# Recipe and measurements: docs/BANDWIDTH.md.
#
#   scripts/bandwidth_lab.sh --hosts 4 --rate 100mbit --measure-iface -- lab-mpirun -np 4 ./train_gpt_cpu ...
#
# Options:
#   --hosts N          emulated hosts (1..250)
#   --rate RATE        per-link rate in both directions: <number>[k|m|g|t]bit (10mbit, 100mbit, 1gbit) or none
#   --burst B          tbf burst (tc syntax: bytes, or 256kbit, 1mbit); default rate * 2.56 ms, >= 4000 bytes
#   --latency L        tbf queue limit as time (tc syntax); default 50ms, at least 2 Mbit of queue (200ms at 10mbit)
#   --delay D          one-way delay between any two hosts, <number>us|ms|s (round trip 2 D); default 0 (a bridge)
#   --slots S          MPI slots per host in the hostfile (default 1: one rank per host)
#   --intra shm|tcp    how ranks of one host talk (with --slots > 1): shm (default) adds Open MPI's shared-memory
#                      btl (vader), so only inter-host bytes cross the shaped eth0; tcp keeps btl tcp,self only
#   --measure-iface    after the command, print per-host eth0 tx/rx bytes and packets counted during the command
#   --iface-json FILE  also write those counts as JSON to FILE
#   --quiet            no setup/teardown messages on stderr
#   --cleanup-stale    (alone) remove namespaces and temp dirs of labs that were killed with SIGKILL
# Every host has its own hostname (its namespace name with - for _), as Open MPI needs to tell hosts apart.
# The command sees: PATH with lab-mpirun and lab-exec (`lab-exec I cmd...` runs cmd in host I), LAB_PREFIX,
# LAB_DIR, LAB_HOSTS (namespace names), LAB_IPS, LAB_SUBNET, LAB_HOSTFILE, LAB_RSH_AGENT, LAB_MPI_FLAGS,
# LAB_RATE, LAB_DELAY_US.
# Exit status: the command's; 128+signal when interrupted; 77 without root / network namespaces /
# tbf ("needs root and network namespaces"); 2 for usage errors.
set -uo pipefail

PROG=bandwidth_lab
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die_usage() { echo "$PROG: $*" >&2; echo "usage: $0 --hosts N --rate RATE [--burst B] [--latency L] [--delay D] [--slots S] [--intra shm|tcp] [--measure-iface] [--iface-json FILE] -- command..." >&2; exit 2; }

hosts="" rate="" burst="" latency="" delay="0ms" slots=1 intra=shm measure=0 iface_json="" quiet=0 cleanup_stale=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts="${2:-}"; shift 2 || die_usage "--hosts needs a value" ;;
    --hosts=*) hosts="${1#*=}"; shift ;;
    --rate) rate="${2:-}"; shift 2 || die_usage "--rate needs a value" ;;
    --rate=*) rate="${1#*=}"; shift ;;
    --burst) burst="${2:-}"; shift 2 || die_usage "--burst needs a value" ;;
    --burst=*) burst="${1#*=}"; shift ;;
    --latency) latency="${2:-}"; shift 2 || die_usage "--latency needs a value" ;;
    --latency=*) latency="${1#*=}"; shift ;;
    --delay) delay="${2:-}"; shift 2 || die_usage "--delay needs a value" ;;
    --delay=*) delay="${1#*=}"; shift ;;
    --slots) slots="${2:-}"; shift 2 || die_usage "--slots needs a value" ;;
    --slots=*) slots="${1#*=}"; shift ;;
    --intra) intra="${2:-}"; shift 2 || die_usage "--intra needs a value" ;;
    --intra=*) intra="${1#*=}"; shift ;;
    --measure-iface) measure=1; shift ;;
    --iface-json) iface_json="${2:-}"; measure=1; shift 2 || die_usage "--iface-json needs a value" ;;
    --iface-json=*) iface_json="${1#*=}"; measure=1; shift ;;
    --quiet) quiet=1; shift ;;
    --cleanup-stale) cleanup_stale=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die_usage "unknown option '$1'" ;;
  esac
done

# --cleanup-stale: remove what labs killed with SIGKILL (no chance to tear down) left: namespaces bwl<PID>*_*
# and temp dirs /tmp/bwl<PID>*.* whose PID is no longer a running bandwidth_lab.sh, and their processes.
if [[ $cleanup_stale -eq 1 ]]; then
  [[ "$(id -u)" -eq 0 ]] || { echo "$PROG: needs root and network namespaces (not running as root)" >&2; exit 77; }
  removed=0
  for entry in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^bwl[0-9]+(x[0-9]+)?_(sw|h[0-9]+)$') \
               $(cd /tmp && ls -d bwl[0-9]*.* 2>/dev/null); do
    owner=${entry#bwl}; owner=${owner%%[!0-9]*}
    if [[ -r /proc/$owner/cmdline ]] && tr '\0' ' ' <"/proc/$owner/cmdline" | grep -q bandwidth_lab; then continue; fi
    if [[ -e "/run/netns/$entry" ]]; then
      for p in $(ip netns pids "$entry" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
      ip netns del "$entry" && removed=$((removed + 1)) && echo "$PROG: removed stale namespace $entry" >&2
    elif [[ -d "/tmp/$entry" ]]; then
      rm -rf -- "/tmp/$entry" && removed=$((removed + 1)) && echo "$PROG: removed stale temp dir /tmp/$entry" >&2
    fi
  done
  echo "$PROG: $removed stale item(s) removed" >&2
  exit 0
fi
[[ $# -gt 0 ]] || die_usage "no command given (put it after --)"
# Whole numbers are decimal even with leading zeros (bash arithmetic would read 010 as octal 8 and refuse 08);
# at most 9 digits, so nothing overflows.
decimal() { [[ "$1" =~ ^[0-9]{1,9}$ ]] && echo $((10#$1)); }
hosts_given=$hosts slots_given=$slots
hosts=$(decimal "$hosts") && ((hosts >= 1 && hosts <= 250)) || die_usage "--hosts must be 1..250, got '$hosts_given'"
slots=$(decimal "$slots") && ((slots >= 1)) || die_usage "--slots must be a whole number >= 1, got '$slots_given'"
[[ "$intra" == shm || "$intra" == tcp ]] || die_usage "--intra must be shm or tcp, got '$intra'"
[[ -n "$rate" ]] || die_usage "--rate is required (e.g. 100mbit, 1gbit or none)"

# Delay in microseconds, for build/lab_delay_switch (the bridge when 0).
if [[ "$delay" =~ ^([0-9]+)(\.[0-9]+)?(us|ms|s)$ ]]; then
  case "${BASH_REMATCH[3]}" in us) mult=1 ;; ms) mult=1000 ;; s) mult=1000000 ;; esac
  delay_us=$(awk -v n="${BASH_REMATCH[1]}${BASH_REMATCH[2]}" -v m="$mult" 'BEGIN { printf "%.0f", n * m }')
  awk -v d="$delay_us" 'BEGIN { exit !(d + 0 <= 10000000) }' || die_usage "--delay '$delay' is above 10s"
else
  die_usage "--delay must look like 500us, 20ms or 0.1s, got '$delay'"
fi
delay_switch="${LAB_DELAY_SWITCH:-$(cd "$(dirname "$0")/.." && pwd)/build/lab_delay_switch}"
if [[ "$delay_us" -gt 0 && ! -x "$delay_switch" ]]; then
  echo "$PROG: --delay needs $delay_switch (build it with: make build/lab_delay_switch)" >&2; exit 2
fi

# Rate in bit/s (for the default burst); tc gets the rate text as given.
rate_bps=0
if [[ "$rate" != none ]]; then
  if [[ "$rate" =~ ^([0-9]+)(\.[0-9]+)?([kmgtKMGT]?)bit$ ]]; then
    mult=1
    case "${BASH_REMATCH[3],,}" in k) mult=1000 ;; m) mult=1000000 ;; g) mult=1000000000 ;; t) mult=1000000000000 ;; esac
    rate_bps=$(awk -v n="${BASH_REMATCH[1]}${BASH_REMATCH[2]}" -v m="$mult" 'BEGIN { printf "%.0f", n * m }')
    awk -v r="$rate_bps" 'BEGIN { exit !(r + 0 >= 8000) }' || die_usage "--rate '$rate' is below 8kbit"
  else
    die_usage "--rate must look like 10mbit, 100mbit, 1gbit (or none), got '$rate'"
  fi
  # Default burst: 2.56 ms worth of tokens (256kbit at 100mbit, 2.56mbit at 1gbit, as the verified recipe
  # needs: smaller bursts cause retransmits at high rates), but at least 4000 bytes (a few full-size frames).
  if [[ -z "$burst" ]]; then
    burst=$(awk -v r="$rate_bps" 'BEGIN { b = r * 0.00256 / 8; if (b < 4000) b = 4000; printf "%.0f", b }')  # bytes
  fi
  # Default queue: 50 ms, but at least 2 Mbit (250 kB) worth, i.e. 200 ms at 10mbit, 100 ms at 20mbit. With
  # 50 ms at 10-20 mbit a TCP window overflows the queue: iperf3 showed hundreds of retransmits (5-10% of
  # the bytes); with this rule none at 10, 20, 100 mbit and 1 gbit.
  if [[ -z "$latency" ]]; then
    latency=$(awk -v r="$rate_bps" 'BEGIN { l = 2e9 / r; if (l < 50) l = 50; printf "%.0fms", l }')
  fi
fi

say() { [[ $quiet -eq 1 ]] || echo "$PROG: $*" >&2; }
skip() { echo "$PROG: needs root and network namespaces ($*)" >&2; exit 77; }

[[ "$(id -u)" -eq 0 ]] || skip "not running as root"
command -v ip >/dev/null || skip "'ip' (iproute2) not installed"
[[ "$rate" == none ]] || command -v tc >/dev/null || skip "'tc' (iproute2) not installed"

# Names carry this invocation's PID; a leftover of an earlier lab with the same PID gets a random suffix.
prefix="bwl$$"
while [[ -e "/run/netns/${prefix}_sw" || -e "/run/netns/${prefix}_h0" ]]; do prefix="bwl$$x$RANDOM"; done
switch_ns="${prefix}_sw"
host_ns=()
ips=()
for ((i = 0; i < hosts; i++)); do host_ns+=("${prefix}_h$i"); ips+=("10.77.0.$((i + 1))"); done
subnet="10.77.0.0/24"
lab_dir=""
created_ns=()
cmd_pid=""
cleaned=0

# Terminates the command's process group and every process inside our namespaces, deletes the namespaces
# (which removes their veths, bridge and qdiscs) and the temp dir. Safe to run more than once.
cleanup() {
  [[ $cleaned -eq 1 ]] && return
  cleaned=1
  trap '' INT TERM HUP
  local pids p ns waited
  if [[ -n "$cmd_pid" ]] && kill -0 "$cmd_pid" 2>/dev/null; then
    kill -TERM -- "-$cmd_pid" 2>/dev/null || kill -TERM "$cmd_pid" 2>/dev/null
  fi
  # Processes inside the lab (mpirun, orted, ranks), found by namespace: TERM, a grace period, then KILL.
  for waited in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21; do
    pids=""
    for ns in "${created_ns[@]}"; do pids+=" $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"; done
    if [[ -n "$cmd_pid" ]] && kill -0 "$cmd_pid" 2>/dev/null; then pids+=" $cmd_pid"; fi
    [[ -z "${pids// /}" ]] && break
    if [[ $waited -eq 1 ]]; then
      for p in $pids; do kill -TERM "$p" 2>/dev/null; done
    elif [[ $waited -ge 20 ]]; then
      for p in $pids; do kill -KILL "$p" 2>/dev/null; done
      [[ -n "$cmd_pid" ]] && kill -KILL -- "-$cmd_pid" 2>/dev/null
    fi
    sleep 0.1
  done
  if [[ -n "$cmd_pid" ]]; then
    kill -KILL -- "-$cmd_pid" 2>/dev/null  # leftovers of the command outside the lab (same process group)
    wait "$cmd_pid" 2>/dev/null
  fi
  for ns in "${created_ns[@]}"; do ip netns del "$ns" 2>/dev/null; done
  [[ -n "$lab_dir" && -d "$lab_dir" ]] && rm -rf -- "$lab_dir"
  say "removed lab $prefix"
}
on_signal() {
  say "caught SIG$1, tearing down"
  cleanup
  trap - EXIT
  exit "$2"
}
trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP

fail_setup() { echo "$PROG: setup failed: $*" >&2; exit 1; }

# ---- setup ----
# Each name is recorded before it is created, so a signal in between still gets it deleted.
created_ns+=("$switch_ns")
ip netns add "$switch_ns" 2>/dev/null || skip "cannot create a network namespace"
for ns in "${host_ns[@]}"; do
  created_ns+=("$ns")
  ip netns add "$ns" || fail_setup "ip netns add $ns"
done
# No IPv6 (router solicitations and DAD would add stray bytes to the interface counters).
for ns in "${created_ns[@]}"; do
  ip netns exec "$ns" sh -c 'sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1' 2>/dev/null
  ip -n "$ns" link set lo up || fail_setup "lo up in $ns"
done
# With a delay, the hosts are tuned as for long links: TCP windows up to 64 MB (the defaults stop at 6 MB of
# receive buffer, ~3 MB of window: 600 Mbit/s at a 40 ms round trip; autotuning still sizes each connection),
# and no slow start after idle (by default a connection idle for one retransmission timeout, ~200 ms here,
# restarts from a 10-segment window, so every step's first messages would pay several round trips more).
if [[ "$delay_us" -gt 0 ]]; then
  for ns in "${host_ns[@]}"; do
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 131072 67108864" net.ipv4.tcp_wmem="4096 16384 67108864" \
      net.ipv4.tcp_slow_start_after_idle=0 || fail_setup "TCP settings in $ns"
  done
fi
if [[ "$delay_us" -eq 0 ]]; then
  ip -n "$switch_ns" link add br0 type bridge || fail_setup "bridge in $switch_ns"
  ip -n "$switch_ns" link set br0 up || fail_setup "br0 up"
fi
for ((i = 0; i < hosts; i++)); do
  ns="${host_ns[$i]}"
  ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$switch_ns" || fail_setup "veth for $ns"
  ip -n "$ns" addr add "${ips[$i]}/24" dev eth0 || fail_setup "address of $ns"
  if [[ "$delay_us" -eq 0 ]]; then ip -n "$switch_ns" link set "p$i" master br0 || fail_setup "p$i on the bridge"; fi
  if [[ "$rate" != none ]]; then
    if ! err=$(ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency "$latency" 2>&1); then
      [[ "$err" == *illegal* ]] && { echo "$PROG: tc rejected rate '$rate' / burst '$burst': $err" >&2; exit 2; }
      skip "the tbf qdisc is not available: $err"
    fi
    ip netns exec "$switch_ns" tc qdisc add dev "p$i" root tbf rate "$rate" burst "$burst" latency "$latency" ||
      fail_setup "tbf on p$i"
  fi
  ip -n "$ns" link set eth0 up || fail_setup "eth0 up in $ns"
  ip -n "$switch_ns" link set "p$i" up || fail_setup "p$i up"
done

lab_dir=$(mktemp -d "/tmp/${prefix}.XXXXXX") || fail_setup "mktemp"
mkdir -p "$lab_dir/bin" "$lab_dir/tmp"
hostfile="$lab_dir/hostfile"
# The delaying switch (in place of the bridge): started in the switch namespace, so teardown ends it with the
# rest of the lab; setup waits until its sockets are bound.
switch_pid=""
if [[ "$delay_us" -gt 0 ]]; then
  ports=$(for ((i = 0; i < hosts; i++)); do echo -n "p$i,"; done); ports=${ports%,}
  ip netns exec "$switch_ns" "$delay_switch" --delay_us "$delay_us" --ports "$ports" \
    --ready "$lab_dir/switch.ready" 2>"$lab_dir/switch.log" &
  switch_pid=$!
  for _ in $(seq 100); do
    [[ -e "$lab_dir/switch.ready" ]] || ! kill -0 "$switch_pid" 2>/dev/null && break
    sleep 0.05
  done
  [[ -e "$lab_dir/switch.ready" ]] || fail_setup "lab_delay_switch did not start: $(tail -n 1 "$lab_dir/switch.log")"
fi
for ip in "${ips[@]}"; do echo "$ip slots=$slots"; done >"$hostfile"

# rsh agent: Open MPI calls `agent [options] HOST COMMAND...`; run COMMAND inside HOST's namespace.
agent="$lab_dir/bin/lab-rsh"
{
  echo '#!/bin/sh'
  echo "# Open MPI rsh agent of lab $prefix: maps a lab host address to its network namespace."
  echo 'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done'
  echo 'host=$1; shift'
  echo 'case "$host" in'
  for ((i = 0; i < hosts; i++)); do echo "  ${ips[$i]}|${host_ns[$i]}) ns=${host_ns[$i]} ;;"; done
  echo '  *) echo "lab-rsh: unknown lab host $host" >&2; exit 255 ;;'
  echo 'esac'
  echo "# Each host gets its own TMPDIR: all hosts share this file system and hostname, so Open MPI daemons"
  echo "# would otherwise share one session directory (and its hwloc/pmix files), which kills some at start."
  echo "mkdir -p $lab_dir/tmp/\$ns"
  echo "# Each host also gets its own UTS hostname (its namespace name): Open MPI tells nodes apart by hostname,"
  echo "# and with one shared name it takes every rank for a local peer (shared-memory and MPI_COMM_TYPE_SHARED"
  echo "# splits across hosts; ranks crashed at the first collective with 2 slots per host)."
  echo "exec ip netns exec \"\$ns\" unshare --uts $lab_dir/bin/lab-uts \"\$ns\" env TMPDIR=$lab_dir/tmp/\$ns sh -c \"\$*\""
} >"$agent"
{
  echo '#!/bin/sh'
  echo "# lab-uts NAME COMMAND...: sets the hostname to NAME with - for _ (in a new UTS namespace; hostnames take"
  echo "# no underscore) and runs COMMAND (lab $prefix)."
  echo 'hostname "$(echo "$1" | tr _ -)" && shift && exec "$@"'
} >"$lab_dir/bin/lab-uts"

# Ranks of one host share memory through vader; with tcp only, they crashed Open MPI 4.1 here (a segfault in
# ob1's receive path at the first all-reduce, 2 hosts x 2 slots).
btl="tcp,self"
[[ $slots -gt 1 && "$intra" == shm ]] && btl="vader,tcp,self"
mpi_flags="--hostfile $hostfile --mca plm_rsh_agent $agent --mca btl $btl"
mpi_flags+=" --mca btl_tcp_if_include $subnet --mca oob_tcp_if_include $subnet --mca btl_tcp_flags send"
mpi_flags+=" --mca mpi_yield_when_idle 1"
# lab-mpirun: mpirun inside host 0. TMPDIR (one per host, also set by the agent) keeps Open MPI's session
# directories inside the lab dir, so they are removed with it even when a job is killed. No
# plm_rsh_no_tree_spawn: that makes the daemons detach (--daemonize), and mpirun then waits forever for a
# daemon that died at start instead of failing.
{
  echo '#!/bin/sh'
  echo "# mpirun across the emulated hosts of lab $prefix (see scripts/bandwidth_lab.sh)."
  echo "mkdir -p $lab_dir/tmp/${host_ns[0]}"
  echo "export TMPDIR=$lab_dir/tmp/${host_ns[0]} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  echo "exec ip netns exec ${host_ns[0]} unshare --uts $lab_dir/bin/lab-uts ${host_ns[0]} mpirun $mpi_flags \"\$@\""
} >"$lab_dir/bin/lab-mpirun"
{
  echo '#!/bin/sh'
  echo "# lab-exec I COMMAND...: runs COMMAND inside emulated host I of lab $prefix."
  echo 'i=$1; shift'
  echo "exec ip netns exec ${prefix}_h\$i unshare --uts $lab_dir/bin/lab-uts ${prefix}_h\$i \"\$@\""
} >"$lab_dir/bin/lab-exec"
chmod +x "$agent" "$lab_dir/bin/lab-uts" "$lab_dir/bin/lab-mpirun" "$lab_dir/bin/lab-exec"

export LAB_PREFIX="$prefix" LAB_DIR="$lab_dir" LAB_HOSTS="${host_ns[*]}" LAB_IPS="${ips[*]}" LAB_SUBNET="$subnet"
export LAB_HOSTFILE="$hostfile" LAB_RSH_AGENT="$agent" LAB_MPI_FLAGS="$mpi_flags" LAB_RATE="$rate"
export LAB_DELAY_US="$delay_us"
export PATH="$lab_dir/bin:$PATH"
delay_text=""
[[ "$delay_us" -gt 0 ]] && delay_text=", one-way delay $delay (lab_delay_switch)"
if [[ "$rate" == none ]]; then
  say "lab $prefix: $hosts host(s) ${ips[0]}..${ips[$((hosts - 1))]}, unlimited links$delay_text"
else
  say "lab $prefix: $hosts host(s) ${ips[0]}..${ips[$((hosts - 1))]}, $rate each way per host" \
      "(tbf burst $burst bytes, queue $latency)$delay_text"
fi

read_counters() {  # prints "tx_bytes rx_bytes tx_packets rx_packets" of eth0 in host namespace $1
  ip netns exec "$1" sh -c 'cd /sys/class/net/eth0/statistics && echo $(cat tx_bytes rx_bytes tx_packets rx_packets)'
}
declare -a before=()
if [[ $measure -eq 1 ]]; then
  for ((i = 0; i < hosts; i++)); do before[$i]=$(read_counters "${host_ns[$i]}"); done
fi

# ---- the command: its own process group (setsid), so teardown can end all of it ----
setsid "$@" &
cmd_pid=$!
wait "$cmd_pid"
rc=$?
if [[ -n "$switch_pid" ]]; then  # its closing line: frames forwarded, flooded and dropped
  kill -TERM "$switch_pid" 2>/dev/null; wait "$switch_pid" 2>/dev/null
  say "$(tail -n 1 "$lab_dir/switch.log")"
fi

if [[ $measure -eq 1 ]]; then
  json="{\"rate\": \"$rate\", \"burst\": \"${burst}\", \"latency\": \"${latency}\", \"delay_us\": $delay_us,"
  json+=" \"hosts\": ["
  total_tx=0 total_rx=0
  echo "interface bytes during the command (eth0 per host; frames incl. Ethernet/IP/TCP headers):"
  printf '  %-4s %-11s %14s %14s %10s %10s\n' host address tx_bytes rx_bytes tx_pkts rx_pkts
  for ((i = 0; i < hosts; i++)); do
    read -r tb rb tp rp <<<"${before[$i]}"
    read -r ta ra tpa rpa <<<"$(read_counters "${host_ns[$i]}")"
    dt=$((ta - tb)) dr=$((ra - rb)) dtp=$((tpa - tp)) drp=$((rpa - rp))
    total_tx=$((total_tx + dt)) total_rx=$((total_rx + dr))
    printf '  h%-3d %-11s %14d %14d %10d %10d\n' "$i" "${ips[$i]}" "$dt" "$dr" "$dtp" "$drp"
    [[ $i -gt 0 ]] && json+=", "
    json+="{\"host\": $i, \"address\": \"${ips[$i]}\", \"tx_bytes\": $dt, \"rx_bytes\": $dr, \"tx_packets\": $dtp, \"rx_packets\": $drp}"
  done
  printf '  %-16s %14d %14d\n' total "$total_tx" "$total_rx"
  json+="], \"exit_code\": $rc}"
  if [[ -n "$iface_json" ]]; then echo "$json" >"$iface_json" || echo "$PROG: cannot write $iface_json" >&2; fi
fi
exit "$rc"
