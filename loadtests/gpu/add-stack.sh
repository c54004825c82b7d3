#!/usr/bin/env bash
# Add nginx and redis-server, from this machine's Debian packages (`make system-deps`), to
# .gpu-site/stack/ for the `replicas` variant of run.sh: the GPU image has neither and no package
# manager that reaches a mirror. Each binary gets a wrapper that points it alone at the libraries
# copied beside it (the Python processes keep the image's own). Only libraries a slim Ubuntu or
# Debian image may lack are copied, to stay inside the 64 MiB the device tool carries; if a
# binary there reports another one missing, add it to `libs` below.
# Usage, from the repository root:  bash loadtests/gpu/add-stack.sh
set -euo pipefail
stack=.gpu-site/stack
rm -rf "$stack"; mkdir -p "$stack/bin" "$stack/libexec" "$stack/lib"
nginx=$(command -v nginx || echo /usr/sbin/nginx)
redis=$(readlink -f "$(command -v redis-server)")
[ -x "$nginx" ] && [ -x "$redis" ] || { echo "needs nginx and redis-server: make system-deps" >&2; exit 1; }
cp "$nginx" "$stack/libexec/nginx"
cp "$redis" "$stack/libexec/redis-server"
libs="libjemalloc.so.2 liblzf.so.1 libatomic.so.1 libpcre2-8.so.0 libcrypt.so.1"
for binary in "$nginx" "$redis"; do
  ldd "$binary" | while read -r name _ path _; do
    case " $libs " in *" $name "*) cp -L "$path" "$stack/lib/" ;; esac
  done
done
for name in nginx redis-server; do
  cat > "$stack/bin/$name" <<WRAP
#!/bin/sh
here=\$(dirname "\$0")
LD_LIBRARY_PATH="\$here/../lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/../libexec/$name" "\$@"
WRAP
  chmod +x "$stack/bin/$name"
done
"$stack/bin/nginx" -v && "$stack/bin/redis-server" --version
du -sh "$stack" .gpu-site
