#!/usr/bin/env bash
# A one-node Slurm (Debian's 22.05) on this machine, from nothing, for the test suite.
#
#   scripts/slurm_cluster.sh start    install what is missing, configure, start, wait until idle
#   scripts/slurm_cluster.sh stop     stop the daemons this script started (pid files)
#   scripts/slurm_cluster.sh status   sinfo of the node, or exit 1 when the cluster is down
#
# Needs root (daemons, apt-get). Daemons are started by hand, not by systemd, so it works in
# containers. No accounting. The node advertises stand-in GPUs (character devices made with
# mknod, File= in gres.conf) so that sbatch accepts --gpus-per-node; nothing uses them.
set -euo pipefail

state=${SLURM_CLUSTER_STATE:-/var/lib/nemo-topr-slurm}
conf_dir=/etc/slurm
n_gpus=8
node=$(hostname -s)

die() { echo "slurm_cluster: $*" >&2; exit 1; }

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    ((${#missing[@]} == 0)) && return
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    echo "slurm_cluster: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; } ||
        die "apt-get install ${missing[*]} failed"
}

write_config() {
    local cpus mem_mb i
    cpus=$(nproc)
    # Leave 1 GiB to the system; RealMemory above what slurmd sees would drain the node.
    mem_mb=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 1024 ))
    mkdir -p "$conf_dir" "$state"/{ctld,d,dev} /var/log/slurm
    for ((i = 0; i < n_gpus; i++)); do
        # Same major/minor as /dev/null: a character device slurmd can stat and constrain.
        [[ -c $state/dev/gpu$i ]] || mknod "$state/dev/gpu$i" c 1 3
    done
    cat >"$conf_dir/slurm.conf" <<EOF
# Written by nemo_topr scripts/slurm_cluster.sh: one node, test suite only.
ClusterName=nemotopr
SlurmctldHost=$node
AuthType=auth/munge
AuthInfo=cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
KillWait=5
MinJobAge=300
JobRequeue=1
NodeName=$node CPUs=$cpus RealMemory=$mem_mb Gres=gpu:$n_gpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
    cat >"$conf_dir/gres.conf" <<EOF
NodeName=$node Name=gpu File=$state/dev/gpu[0-$((n_gpus - 1))]
EOF
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

start() {
    [[ $(id -u) == 0 ]] || die "needs root (daemons, apt-get); running as $(id -un)"
    install_packages
    write_config
    start_munge
    running "$state/slurmctld.pid" || slurmctld
    running "$state/slurmd.pid" || slurmd
    for _ in $(seq 120); do
        if sinfo -h -N -n "$node" -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            return
        fi
        # A node left down/drained by an earlier stop comes back on its own with
        # ReturnToService=2; resume it explicitly when it does not.
        if sinfo -h -N -n "$node" -o %T 2>/dev/null | grep -qE 'down|drain'; then
            scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
        fi
        sleep 0.5
    done
    sinfo -N >&2 || true
    tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
    die "node $node not idle after 60 s"
}

stop() {
    local pidfile pid
    for pidfile in "$state/slurmd.pid" "$state/slurmctld.pid"; do
        running "$pidfile" || continue
        pid=$(cat "$pidfile")
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
}

status() {
    running "$state/slurmctld.pid" && running "$state/slurmd.pid" || { echo "slurm_cluster: down"; exit 1; }
    sinfo -N
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: $0 start|stop|status" ;;
esac
