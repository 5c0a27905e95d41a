#!/usr/bin/env bash
# Installs the three inference engines whose storage interfaces deepio.kv plugs into, at the
# versions tests/python/test_kv_backends.py and bench/kv_bench.py drive (docs/kv-backends.md, "Tested
# versions"): SGLang 0.5.23, LMCache 0.5.6 and vLLM 0.33.0. Their full installs need CUDA, so each
# is installed without its dependencies, with only the small packages its interface modules
# import (found by importing them on a CPU-only machine with torch 2.13 CPU).
#
# They go into a folder of their own, not into site-packages: PyPI's torchvision (which SGLang's
# host-pool modules import) is a CUDA build whose `import torchvision` raises on CPU torch, and
# transformers would change what DeepSpeed and the rest of the suite import. Only the files that
# drive the engines put the folder on sys.path (tests/python/kv_engines.py, bench/kv_bench.py).
#
# The folder: $DEEPIO_KV_ENGINES (default ~/.cache/deepio/kv-engines-<python version>), outside
# the clone, so CI on the same machine finds it made. Idempotent and quick: a stamp file names
# the pins installed; when it matches, nothing runs. Called by scripts/setup.sh; usable alone
# (environment: PYTHON). Prints the folder.
set -euo pipefail
py=${PYTHON:-python3}

# The engines and the packages their interface modules import, pinned where an engine pins
# them (transformers, tokenizers, sentencepiece, compressed-tensors, apache-tvm-ffi, numba:
# SGLang's own requirements) or where a newer release could change the import graph.
pinned=("sglang==0.5.23" "lmcache==0.5.6" "vllm==0.33.0"
        "transformers==5.19.0" "tokenizers==0.23.2" "sentencepiece==0.2.1" "compressed-tensors==0.18.0"
        "apache-tvm-ffi==0.1.11" "numba==0.65.1" "llvmlite==0.50.0" "torchvision==0.28.0"
        "triton==3.9.0" "huggingface-hub==2.4.0" "pybase64==1.5.1" "pillow==13.0.0"
        "starlette==1.10.0" "anyio==4.16.0" "msgspec==0.22.0" "pyzmq==27.3.0" "aiohttp==3.14.5"
        "multidict==7.2.1" "yarl==1.25.1" "propcache==0.5.4" "aiohappyeyeballs==2.7.1"
        "aiosignal==1.4.0" "frozenlist==1.8.0" "httpx2==2.16.2" "httpcore2==2.16.2" "h11==0.16.0"
        "truststore==0.10.5" "dill==0.4.1" "loguru==0.7.3" "gguf==0.19.0"
        "prometheus-client==0.26.0" "cachetools==8.0.2")
# Also imported; present on the project's machines (base image or setup.sh): installed into
# the folder only where the interpreter lacks them, at the newest release.
# Their own imports are listed too (installed without dependencies, a bare environment has
# none of them): found by importing the interface modules from a bare virtual environment
# with only torch and numpy.
common=(orjson requests ipython pyyaml jinja2 pydantic psutil regex tqdm scipy py-cpuinfo
        sortedcontainers cryptography safetensors packaging filelock sympy networkx
        urllib3 idna certifi attrs cffi pycparser pydantic-core annotated-types typing-inspection
        traitlets pygments)

pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
dest=${DEEPIO_KV_ENGINES:-$HOME/.cache/deepio/kv-engines-$pyver}
stamp="$dest/.deepio-kv-engines"
want="${pinned[*]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$dest"
  exit 0
fi
# Replaced whole when the pins changed; never a folder this script did not make.
if [ -d "$dest" ] && [ ! -f "$stamp" ] && [ -n "$(ls -A "$dest")" ]; then
  echo "setup-kv-engines.sh: $dest is not empty and was not made by this script; not touching it" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest"
echo "installing" >"$stamp"  # a run cut short leaves this: the next run starts over
# The common ones only where the interpreter lacks them (as on a bare Python).
missing=()
for p in "${common[@]}"; do
  "$py" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$p" 2>/dev/null || missing+=("$p")
done
"$py" -m pip install -q --no-deps --target "$dest" "${pinned[@]}" "${missing[@]}"
echo "$want" >"$stamp"
echo "$dest"
