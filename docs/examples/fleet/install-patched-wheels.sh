#!/bin/sh
# install-patched-wheels WHEELS SPEC... : install `t4patch wheel` wheels over an engine's normal dependency set.
#
# WHEELS is a directory of patched wheels with their SHA256SUMS (what `t4patch wheel -o WHEELS` writes), and
# optionally WHEELS/tools/ with a t4patch wheel and its dependencies (`pip wheel -w WHEELS/tools CHECKOUT`).
# Each SPEC (vllm==0.33.0, sglang==0.5.23) is installed from WHEELS only, without dependencies and replacing a
# stock install of the same release, so the engine's dependency set must already be there (pip install
# ENGINE==VERSION first; SGLang's, then vLLM beside it, see docs/fleet.md). Then t4patch checks the result:
# `t4patch status --check` must pass, which is also the image's health check.
#
# Environment: PYTHON   the serving interpreter (default: python3 on PATH)
#              T4PATCH  an installed t4patch to check with (default: one installed into T4PATCH_VENV from
#                       WHEELS/tools, T4PATCH_VENV defaulting to /opt/t4patch)
set -eu

if [ "$#" -lt 2 ]; then
    echo "usage: install-patched-wheels WHEELS SPEC..." >&2
    exit 2
fi
wheels=$1
shift
python=${PYTHON:-python3}

# Every wheel must be the one t4patch wrote: a truncated copy or a swapped file stops the image build here.
(cd "$wheels" && sha256sum --check --strict SHA256SUMS)

names=""
for spec in "$@"; do
    "$python" -m pip install --no-cache-dir --disable-pip-version-check --no-deps --no-index --force-reinstall \
        --find-links "$wheels" "$spec"
    names="$names ${spec%%[=<>!~]*}"
done

if [ -z "${T4PATCH:-}" ]; then
    venv=${T4PATCH_VENV:-/opt/t4patch}
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --no-cache-dir --disable-pip-version-check --no-index --find-links "$wheels/tools" t4patch
    T4PATCH=$venv/bin/t4patch
fi

# shellcheck disable=SC2086 # one argument per engine name
"$T4PATCH" status --check --python "$(command -v "$python")" $names
