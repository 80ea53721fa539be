#!/usr/bin/env bash
# A one-node Slurm (Debian's 22.05) on this machine, from nothing, for the test suite; with
# --two-nodes, a separate two-node one (below).
#
#   scripts/slurm_cluster.sh [--two-nodes] start    install what is missing, configure, start, wait until idle
#   scripts/slurm_cluster.sh [--two-nodes] stop     stop the daemons this script started (pid files)
#   scripts/slurm_cluster.sh [--two-nodes] status   sinfo of the nodes, or exit 1 when the cluster is down
#
# Needs root (daemons, apt-get). Daemons are started by hand, not by systemd, so it works in
# containers. No accounting. The node advertises stand-in GPUs (character devices made with
# mknod, File= in gres.conf) so that sbatch accepts --gpus-per-node; nothing uses them.
#
# --two-nodes: a second, separate cluster of two nodes, topr-node1 and topr-node2. Each node's
# slurmd runs in its own network namespace with its own address (10.77.0.11, .12, on a bridge
# whose side here is 10.77.0.1), /etc/hosts (STATE/netns/NODE/hosts bind-mounted, as ip netns exec
# does with /etc/netns) and hostname (a UTS namespace): a rank's hostname then resolves to an address the
# other node reaches, which is what gloo binds to and what MASTER_ADDR (the first node) must be.
# Its slurmctld runs here, on port 6827 with its config in STATE/etc, so it co-exists with the
# one-node cluster (6817, /etc/slurm). Clients need SLURM_CONF=STATE/etc/slurm.conf: `start`
# prints that export as its last line. `stop` also removes the namespaces, bridge and hosts files.
set -euo pipefail

n_gpus=8
host=$(hostname -s)
two_nodes=0
if [[ ${1:-} == --two-nodes ]]; then
    two_nodes=1
    shift
fi
if ((two_nodes)); then
    state=${SLURM_CLUSTER_STATE:-/var/lib/nemo-topr-slurm-two-nodes}
    conf_dir=$state/etc
    log_dir=$state/log
    nodes=(topr-node1 topr-node2)
    subnet=10.77.0  # .1 the bridge (slurmctld's address), .11 and .12 the nodes
    bridge=toprbr0
    hosts_dir=$state/netns  # NODE/hosts: the /etc/hosts each node sees
    export SLURM_CONF=$conf_dir/slurm.conf  # for the daemons and the clients below
    cluster_name=nemotopr2
    ctld_host="$host($subnet.1)"
    ctld_port=6827
    slurmd_spool=$state/%n/spool  # slurmd puts its node name in place of %n (slurm.conf(5))
    slurmd_pid=$state/%n/slurmd.pid
    slurmd_log=$log_dir/slurmd-%n.log
else
    state=${SLURM_CLUSTER_STATE:-/var/lib/nemo-topr-slurm}
    conf_dir=/etc/slurm
    log_dir=/var/log/slurm
    nodes=("$host")
    subnet=
    cluster_name=nemotopr
    ctld_host=$host
    ctld_port=6817  # Slurm's default
    slurmd_spool=$state/d
    slurmd_pid=$state/slurmd.pid
    slurmd_log=$log_dir/slurmd.log
fi

die() { echo "slurm_cluster: $*" >&2; exit 1; }

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    if ((two_nodes)); then command -v ip >/dev/null || missing+=(iproute2); fi
    ((${#missing[@]} == 0)) && return
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    echo "slurm_cluster: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; } ||
        die "apt-get install ${missing[*]} failed"
}

write_config() {
    local cpus mem_mb i node
    # nproc answers OMP_NUM_THREADS where it is set (coreutils): a node of 1 CPU would hold no 2-task job
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
    # Leave 1 GiB to the system; RealMemory above what slurmd sees would drain the node.
    mem_mb=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 1024 ))
    mkdir -p "$conf_dir" "$state"/{ctld,dev} "$log_dir"
    for node in "${nodes[@]}"; do mkdir -p "${slurmd_spool//%n/$node}" "$(dirname "${slurmd_pid//%n/$node}")"; done
    for ((i = 0; i < n_gpus; i++)); do
        # Same major/minor as /dev/null: a character device slurmd can stat and constrain.
        [[ -c $state/dev/gpu$i ]] || mknod "$state/dev/gpu$i" c 1 3
    done
    # A requeued job waits cred_expire + 1 s (slurmctld's job_mgr.c) and then the scheduler's next
    # pass: both at Slurm's minimum (5 s, 1 s), a requeued test job restarts about 6 s later.
    cat >"$conf_dir/slurm.conf" <<EOF
# Written by nemo_topr scripts/slurm_cluster.sh: ${#nodes[@]} node(s), test suite only.
ClusterName=$cluster_name
SlurmctldHost=$ctld_host
SlurmctldPort=$ctld_port
AuthType=auth/munge
AuthInfo=cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$slurmd_spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$log_dir/slurmctld.log
SlurmdLogFile=$slurmd_log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
KillWait=5
MinJobAge=300
JobRequeue=1
EOF
    : >"$conf_dir/gres.conf"
    for i in "${!nodes[@]}"; do
        # Every node sees the whole machine (CPUs, memory) and the same stand-in GPUs.
        echo "NodeName=${nodes[i]}${subnet:+ NodeAddr=$subnet.$((11 + i))} CPUs=$cpus RealMemory=$mem_mb" \
             "Gres=gpu:$n_gpus State=UNKNOWN" >>"$conf_dir/slurm.conf"
        echo "NodeName=${nodes[i]} Name=gpu File=$state/dev/gpu[0-$((n_gpus - 1))]" >>"$conf_dir/gres.conf"
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP" \
         "OverSubscribe=YES" >>"$conf_dir/slurm.conf"
}

# The two nodes' network: a bridge here and a namespace per node on it, with a hosts file that
# names every node.
network_up() {
    local i j node
    if ! ip link show "$bridge" >/dev/null 2>&1; then
        ip link add "$bridge" type bridge
        ip addr add "$subnet.1/24" dev "$bridge"
    fi
    ip link set "$bridge" up
    for i in "${!nodes[@]}"; do
        node=${nodes[i]}
        mkdir -p "$hosts_dir/$node"
        {
            echo "127.0.0.1 localhost"
            for j in "${!nodes[@]}"; do echo "$subnet.$((11 + j)) ${nodes[j]}"; done
        } >"$hosts_dir/$node/hosts"
        [[ -e /run/netns/$node ]] && continue
        ip netns add "$node"
        ip link add "toprv$i" type veth peer name eth0 netns "$node"
        ip link set "toprv$i" master "$bridge" up
        ip -n "$node" addr add "$subnet.$((11 + i))/24" dev eth0
        ip -n "$node" link set eth0 up
        ip -n "$node" link set lo up
    done
}

# Each pair's host end before its namespace: deleting it takes the pair at once, whereas a deleted
# namespace lives on while a process is still inside it, and the kernel then tears its links down
# in the background (net/core/net_namespace.c, cleanup_net).
network_down() {
    local i
    for i in "${!nodes[@]}"; do
        delete_link "toprv$i"
        if [[ -e /run/netns/${nodes[i]} ]]; then ip netns del "${nodes[i]}"; fi
    done
    rm -rf "$hosts_dir"
    delete_link "$bridge"
}

# A link that vanishes between the look and the delete is gone, which is what was wanted: the veth
# of a namespace deleted earlier (a stop cut short) goes when that namespace's last process exits.
delete_link() {
    local error
    ip link show "$1" >/dev/null 2>&1 || return 0
    error=$(ip link del "$1" 2>&1) || ! ip link show "$1" >/dev/null 2>&1 || die "ip link del $1: $error"
}

start_munge() {
    mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    chmod 0400 /etc/munge/munge.key
    chmod 0755 /run/munge
    if ! munge -n </dev/null >/dev/null 2>&1; then
        if id munge >/dev/null 2>&1; then
            runuser -u munge -- munged
        else
            munged --force
        fi
    fi
    for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && return; sleep 0.1; done
    die "munged did not start"
}

running() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_slurmd() {
    local node=$1
    if ((two_nodes)); then
        # Not `ip netns exec`: it remounts /sys, hiding /sys/fs/cgroup, without which slurmd
        # fails ("Unable to initialize cgroup plugin"). A private mount namespace holds the
        # node's hosts file, a UTS namespace its hostname; munged's socket is a file, so shared.
        # shellcheck disable=SC2016  # $1 is expanded by the inner sh
        nsenter --net="/run/netns/$node" unshare --mount --uts sh -c \
            'mount --bind "$2" /etc/hosts && hostname "$1" && exec slurmd -N "$1"' sh "$node" "$hosts_dir/$node/hosts"
    else
        slurmd
    fi
}

all_idle() {
    local node
    for node in "${nodes[@]}"; do
        sinfo -h -N -n "$node" -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)' || return 1
    done
}

start() {
    local node
    [[ $(id -u) == 0 ]] || die "needs root (daemons, apt-get); running as $(id -un)"
    # apt-get and munged belong to the machine, and both clusters may start at once (two xdist
    # workers): one start at a time installs and starts them. flock is local here.
    exec 9>/run/nemo-topr-slurm-cluster.lock
    flock 9
    install_packages
    start_munge
    flock -u 9
    write_config
    ((two_nodes)) && network_up
    running "$state/slurmctld.pid" || slurmctld
    for node in "${nodes[@]}"; do running "${slurmd_pid//%n/$node}" || start_slurmd "$node"; done
    for _ in $(seq 120); do
        if all_idle; then
            ((two_nodes)) && echo "export SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        # A node left down/drained by an earlier stop comes back on its own with
        # ReturnToService=2; resume it explicitly when it does not.
        for node in "${nodes[@]}"; do
            if sinfo -h -N -n "$node" -o %T 2>/dev/null | grep -qE 'down|drain'; then
                scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
            fi
        done
        sleep 0.5
    done
    sinfo -N >&2 || true
    tail -n 20 "$log_dir"/slurm*.log >&2 || true
    die "node(s) ${nodes[*]} not idle after 60 s"
}

stop() {
    local pidfile pid node pidfiles=()
    for node in "${nodes[@]}"; do pidfiles+=("${slurmd_pid//%n/$node}"); done
    for pidfile in "${pidfiles[@]}" "$state/slurmctld.pid"; do
        running "$pidfile" || continue
        pid=$(cat "$pidfile")
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    if ((two_nodes)); then network_down; fi
}

status() {
    local node
    running "$state/slurmctld.pid" || { echo "slurm_cluster: down"; exit 1; }
    for node in "${nodes[@]}"; do
        running "${slurmd_pid//%n/$node}" || { echo "slurm_cluster: down"; exit 1; }
    done
    sinfo -N
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: $0 [--two-nodes] start|stop|status" ;;
esac
