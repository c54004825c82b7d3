#!/usr/bin/env bash
# Build .gpu-site/: the project's runtime dependencies that the H200 machine's image lacks,
# as an unpacked Python 3.12 / x86_64 package folder to put on PYTHONPATH there.
# The image already has torch, transformers, numpy, safetensors, tokenizers, accelerate,
# prometheus-client, uvloop, httpx; this adds the web stack and bitsandbytes (CUDA 13 build only).
# Usage, from the project root:  bash loadtests/gpu/make-site.sh [extra-package==version ...]
set -euo pipefail
dest=.gpu-site
rm -rf "$dest"
pkgs=(fastapi starlette pydantic pydantic-core pydantic-settings uvicorn h11 httptools
      cachetools python-dotenv annotated-types typing-inspection typing-extensions
      opentelemetry-api importlib-metadata zipp bitsandbytes fastapi-offline "$@")
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --target "$dest" \
  --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  "${pkgs[@]}" 2>&1 | grep -v '^WARNING' || true
# Detection uses wordfreq's small lists of the model's languages only; its large lists (46 MB)
# and jieba's dictionaries (5.6 MB) would not fit in the 64 MiB a run can carry.
if [ -d "$dest/wordfreq/data" ]; then
  find "$dest/wordfreq/data" \( -name 'large_*' -o -name 'jieba_*' \) -delete
  keep='en fr pt es tr it de vi ms id fil pl cs nl ru uk ar fa ur hi bn he ta ko ja zh'
  for list in "$dest"/wordfreq/data/small_*.msgpack.gz; do
    code=${list##*/small_}; code=${code%.msgpack.gz}
    case " $keep " in *" $code "*) ;; *) rm -f "$list" ;; esac
  done
fi
# bitsandbytes ships one library per CUDA/ROCm/XPU version; the H200 image runs CUDA 13.0.
find "$dest/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*cuda130*' ! -name '*cpu*' -delete
grep -qx '/.gpu-site/' .git/info/exclude 2>/dev/null || echo '/.gpu-site/' >> .git/info/exclude
du -sh "$dest"
echo "on the GPU machine: export PYTHONPATH=\$PWD/.gpu-site:\$PWD"
