#!/usr/bin/env bash
# The Gradescope bundle's setup.sh and run_autograder, run as root in a fresh Ubuntu root made like Gradescope's base
# image (Ubuntu with python3; 24.04, or SUITE=jammy for 22.04, whose bubblewrap setup.sh refuses), then one
# submission graded there with the network cut.
#
#   sudo scripts/check_gradescope_setup.sh WORKDIR
#
# Needs root, debootstrap, bubblewrap, and Ubuntu's archive and PyPI over the network (about 10 minutes, most of
# it pip). WORKDIR/SUITE is made with debootstrap the first time and reused (a copy is taken for each run).
# What it cannot do here is said where it is done differently from Gradescope:
#   COURSE_PYTHON  an interpreter of the pinned version to use instead of uv's download (GitHub, where uv fetches
#                  CPython, may be out of reach); default: setup.sh's own `uv python install`.
#   TORCH_INDEX_URL  where the CPU torch wheel is found (default setup.sh's, download.pytorch.org); pip's
#                  PIP_FIND_LINKS, when set, is passed in (a folder that holds the wheel is bound read-only).
#   PIP_CERT       the certificate authorities pip trusts, when set, are bound in (pip and uv are told).
#   UBUNTU_MIRROR  Ubuntu's archive (default http://archive.ubuntu.com/ubuntu/); without Ubuntu's keyring on
#                  this machine the packages are not signature-checked (--no-check-gpg).
set -euo pipefail
work=$(realpath "${1:?usage: check_gradescope_setup.sh WORKDIR}")
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
mkdir -p "$work"
suite=${SUITE:-noble}
base="$work/$suite"
if [ ! -f "$base/etc/os-release" ]; then
    keyring=(--no-check-gpg)
    if [ -f /usr/share/keyrings/ubuntu-archive-keyring.gpg ]; then
        keyring=(--keyring /usr/share/keyrings/ubuntu-archive-keyring.gpg)
    fi
    # Gradescope's image has a python3 (3.12 on 24.04, 3.10 on 22.04) and no python3-venv: so does this root.
    # (Every Ubuntu release since 7.10 is made by debootstrap's script for gutsy.)
    debootstrap "${keyring[@]}" --variant=minbase --include=python3,ca-certificates "$suite" "$base" \
        "${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu/}" /usr/share/debootstrap/scripts/gutsy
    # The archives of Ubuntu's docker image (python3-venv is in universe).
    rm -f "$base/etc/apt/sources.list.d/ubuntu.sources"
    for part in "" -updates -security; do
        echo "deb ${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu/} $suite$part main restricted universe multiverse"
    done > "$base/etc/apt/sources.list"
fi
image="$work/image"
rm -rf "$image"
cp -a "$base" "$image"

# The bundle, with two exercises graded, and one submission that solves one of them.
cat > "$work/grading.toml" <<'EOF'
[grading]
exercises = ["greedy_search", "apply_temperature"]
EOF
(cd "$repo" && PYTHONPATH="$repo" "$python" -m sampling_course.apps.cli autograder "$work/autograder.zip" \
    --config "$work/grading.toml")
mkdir -p "$image/autograder/source" "$image/autograder/submission"
"$python" -m zipfile -e "$work/autograder.zip" "$image/autograder/source"
chmod +x "$image/autograder/source/setup.sh" "$image/autograder/source/run_autograder"
PYTHONPATH="$repo/tests/course:$repo/tests:$repo" "$python" - "$image/autograder/submission/sampling.py" <<'EOF'
import sys
from pathlib import Path
from test_classroom_slow import BAD_TEMPERATURE, GOOD_GREEDY, stubbed_sampling
Path(sys.argv[1]).write_text(stubbed_sampling(GOOD_GREEDY, BAD_TEMPERATURE))
EOF

binds=(--ro-bind /etc/resolv.conf /etc/resolv.conf)
setenv=()
if [ -n "${COURSE_PYTHON:-}" ]; then
    prefix=$("$COURSE_PYTHON" -c "import sys; print(sys.base_prefix)")
    mkdir -p "$image$prefix"
    binds+=(--ro-bind "$prefix" "$prefix")
    setenv+=(--setenv COURSE_PYTHON "$COURSE_PYTHON")
fi
if [ -n "${PIP_FIND_LINKS:-}" ]; then
    mkdir -p "$image$PIP_FIND_LINKS"
    binds+=(--ro-bind "$PIP_FIND_LINKS" "$PIP_FIND_LINKS")
    setenv+=(--setenv PIP_FIND_LINKS "$PIP_FIND_LINKS")
fi
if [ -n "${PIP_CERT:-}" ]; then  # a machine whose proxy signs with its own authority
    binds+=(--ro-bind "$PIP_CERT" /etc/ssl/host-ca.crt)
    setenv+=(--setenv PIP_CERT /etc/ssl/host-ca.crt --setenv SSL_CERT_FILE /etc/ssl/host-ca.crt)
fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then setenv+=(--setenv TORCH_INDEX_URL "$TORCH_INDEX_URL"); fi
# The image: its own root and /dev, this machine's /proc as a container's (a fresh one, mounted here, would make
# the kernel refuse the sandbox's own /proc in a container whose /proc has masked paths, as docker's has), the
# host's network (setup.sh downloads), a clean environment.
in_image() {
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        bwrap --bind "$image" / --bind /proc /proc --dev /dev "$@"
}
started=$SECONDS
in_image "${binds[@]}" "${setenv[@]}" --chdir /autograder/source bash /autograder/source/setup.sh
echo "setup.sh: $((SECONDS - started)) s"
# Grading time: no network (a network namespace of its own), nothing bound from this machine but the interpreter.
in_image --unshare-net "${binds[@]:3}" --chdir /autograder/source bash /autograder/source/run_autograder
in_image "${binds[@]:3}" /autograder/venv/bin/python - <<'EOF'
import json
import torch
results = json.load(open("/autograder/results/results.json"))
statuses = [t["status"] for t in results["tests"]]
assert results["score"] == 1 and statuses == ["passed", "failed"], (results["score"], statuses)
assert torch.version.cuda is None
print(f"results.json: score {results['score']}, tests {statuses}; torch {torch.__version__}")
EOF
echo "setup.sh and run_autograder passed in an Ubuntu $suite root"
