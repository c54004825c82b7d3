#!/usr/bin/env bash
# Add transformers 5.24, with what it needs beyond the H200 image, to .gpu-site/, after
# loadtests/gpu/make-site.sh built it, keeping the folder under the 64 MiB the device tool carries.
# Usage, from the repository root, where pip works:  bash loadtests/gpu/add-transformers.sh
set -euo pipefail
site=.gpu-site; tmp=$(mktemp -d)
python3 -m pip install -q --no-compile --only-binary=:all: --target "$tmp" \
  --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  transformers==5.24.0 2>&1 | grep -v '^WARNING' || true
for f in "$tmp"/*; do
  name=$(basename "$f")
  case $name in numpy*|bin) continue ;; esac  # the image's numpy goes with its torch
  [ -e "$site/$name" ] || cp -r "$f" "$site/"
done
# Only the model code the service loads (Hunyuan dense, Hy-MT2-30B-A3B's hy_v3, the auto classes
# and what they import).
for d in "$site"/transformers/models/*/; do
  case $(basename "$d") in hunyuan_v1_dense|hy_v3|auto|encoder_decoder|__pycache__) ;; *) rm -rf "$d" ;; esac
done
# Packages the image already has, and ones only transformers' download and CLI paths use.
# The image's tokenizers 0.23.2 and huggingface-hub 1.33 satisfy transformers 5.24; its aiohttp
# (the load generator's client) and pytest are used as they are.
( cd "$site" && rm -rf regex regex-* yaml _yaml pyyaml-* tqdm tqdm-* packaging packaging-* \
  filelock filelock-* fsspec fsspec-* rich rich-* markdown_it markdown_it_py-* mdurl mdurl-* \
  shellingham shellingham-* hf_xet hf_xet-* pygments pygments-* tokenizers tokenizers-* \
  huggingface_hub huggingface_hub-* httpx2 httpx2-* httpcore2 httpcore2-* truststore truststore-* \
  safetensors safetensors-* typer typer-* click click-* aiohttp aiohttp-* aiohappyeyeballs* \
  aiosignal* attr attrs attrs-* frozenlist* multidict* yarl* propcache* idna idna-* \
  _pytest pytest pytest-* pluggy* iniconfig* py.py wrapt-stubs )
rm -rf "$tmp"
du -sh "$site"
