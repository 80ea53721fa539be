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

if [[ ! -x $venv/bin/python ]]; then
    python=$(find_python312)
    echo "setup_venv: creating $venv with $python"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip
echo "setup_venv: installing pinned requirements (first run downloads torch, ~3.5 GB)"
"${pip[@]}" install -q -r requirements.txt -c requirements-lock.txt
"${pip[@]}" install -q --no-deps -r requirements-nodeps.txt
"${pip[@]}" install -q --no-deps --no-build-isolation -e .
echo "$want" > "$stamp"
echo "setup_venv: ready ($venv)"
