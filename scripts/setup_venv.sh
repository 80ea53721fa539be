#!/usr/bin/env bash
# Create or update .venv (Python 3.12) with nemo_topr's pinned dependencies.
#
# Idempotent: the venv records a hash of the requirement files; when they are unchanged a
# second run only checks that hash and returns in well under a second.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${NEMO_TOPR_VENV:-$repo_root/.venv}
stamp=$venv/.requirements.sha256
req_files=(requirements.txt requirements-lock.txt requirements-nodeps.txt pyproject.toml)

cd "$repo_root"
want=$(cat "${req_files[@]}" | sha256sum | cut -d' ' -f1)
if [[ -x $venv/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
    exit 0
fi

find_python312() {
    local candidate root
    for candidate in python3.12 "${PYTHON312:-}"; do
        [[ -n $candidate ]] || continue
        if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            command -v "$candidate"
            return
        fi
    done
    if command -v pyenv >/dev/null; then
        root=$(pyenv root)
        for candidate in "$root"/versions/3.12*/bin/python3.12; do
            [[ -x $candidate ]] && { echo "$candidate"; return; }
        done
    fi
    echo "setup_venv: no Python 3.12 found (Megatron-Bridge requires it); set PYTHON312=/path/to/python3.12" >&2
    exit 1
}

# A venv made from nothing holds 8.2 GB (torch's CUDA build and its NVIDIA libraries) and pip keeps its
# 4.3 GB of downloads in TMPDIR until it ends: 12.5 GB at the peak on one filesystem (bench/venv_disk.sh,
# bench/results/venv_disk_2026-11-29.json). Say so before starting, not as pip's "No space left on
# device" half-way.
gigabytes() { awk -v bytes="$1" 'BEGIN { printf "%.1f GB", bytes / 1e9 }'; }
check_free_space() {
    local venv_parent tmp_dir=${TMPDIR:-/tmp} free
    [[ -d $tmp_dir ]] || tmp_dir=/tmp  # as Python's tempfile does
    venv_parent=$(dirname "$venv")
    mkdir -p "$venv_parent"
    if [[ $(stat -c %d "$venv_parent") == $(stat -c %d "$tmp_dir") ]]; then
        set -- "$venv_parent" 12500000000 "$venv (8.2 GB) and pip's downloads in $tmp_dir (4.3 GB)"
    else
        set -- "$venv_parent" 8200000000 "$venv" "$tmp_dir" 4300000000 "pip's downloads in $tmp_dir"
    fi
    while (($#)); do
        free=$(df -P -B1 "$1" | awk 'NR == 2 { print $4 }')
        if ((free < $2)); then
            echo "setup_venv: $3 need about $(gigabytes "$2") free; $1 has $(gigabytes "$free")." >&2
            echo "setup_venv: free some space, or set NEMO_TOPR_VENV (the venv) and TMPDIR elsewhere" >&2
            exit 1
        fi
        shift 3
    done
}

if [[ ! -x $venv/bin/python ]]; then
    check_free_space
    python=$(find_python312)
    echo "setup_venv: creating $venv with $python"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip
echo "setup_venv: installing pinned requirements (a first run downloads 4.3 GB)"
"${pip[@]}" install -q -r requirements.txt -c requirements-lock.txt
"${pip[@]}" install -q --no-deps -r requirements-nodeps.txt
"${pip[@]}" install -q --no-deps --no-build-isolation -e .
echo "$want" > "$stamp"
echo "setup_venv: ready ($venv)"
