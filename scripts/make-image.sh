#!/bin/sh
# make image: an OCI image of the release binary, built without a Docker engine (umoci).
# Usage: scripts/make-image.sh [BINARY] [LAYOUT]   (defaults: .build/release/sessiongate, .build/image)
#
# The base is Debian 12 in the distroless way: the files the binary needs as Debian ships them
# (glibc with its DNS resolver modules, libstdc++, zlib — found with ldd), the CA
# certificates, and /etc/passwd with the non-root user sessiongate (10001). No shell, no package
# manager: nothing an intruder could use. The Debian packages the files came from are listed in
# /usr/share/doc/sessiongate/image-packages.txt inside the image.
#
# Result: the OCI layout LAYOUT with the tag `sessiongate`; copy it anywhere with
#   skopeo copy oci:.build/image:sessiongate docker://registry.example.com/sessiongate:TAG
# The config (sessiongate.yaml, the .p8, session.key) is mounted at /etc/sessiongate.
set -eu
bin=${1:-.build/release/sessiongate}
layout=${2:-.build/image}
tag=sessiongate
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root

mkdir -p "$root/usr/local/bin" "$root/etc/sessiongate" "$root/etc/ssl/certs" "$root/tmp" "$root/usr/share/doc/sessiongate" "$root/proc" "$root/dev" "$root/sys"
chmod 1777 "$root/tmp"
cp "$bin" "$root/usr/local/bin/sessiongate"
strip "$root/usr/local/bin/sessiongate" 2>/dev/null || true

# The shared libraries, and glibc's name-service modules for getaddrinfo (Redis and upstream
# host names): files and dns.
multiarch=$(dirname "$(ldd "$bin" | awk '/libc\.so/ {print $3}')")
libs=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
for lib in $libs "$multiarch/libnss_files.so.2" "$multiarch/libnss_dns.so.2" "$multiarch/libresolv.so.2"; do
  [ -e "$lib" ] || continue
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# ld.so is found at /lib64 through the usrmerge link on Debian 12.
if [ -L /lib64 ] && [ ! -e "$root/lib64" ]; then ln -s "$(readlink /lib64)" "$root/lib64"; fi
if [ -L /lib ] && [ ! -e "$root/lib" ]; then ln -s "$(readlink /lib)" "$root/lib"; fi
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"

printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nsessiongate:x:10001:10001:sessiongate:/nonexistent:/usr/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nsessiongate:x:10001:\n' > "$root/etc/group"
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n::1 localhost\n' > "$root/etc/hosts"

# Which Debian packages (and versions) the files came from.
for lib in $libs /etc/ssl/certs/ca-certificates.crt; do
  dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
done | cut -d: -f1 | sort -u | while read -r pkg; do
  printf '%s %s\n' "$pkg" "$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)"
done > "$root/usr/share/doc/sessiongate/image-packages.txt"
printf 'ca-certificates %s\n' "$(dpkg-query -W -f='${Version}' ca-certificates 2>/dev/null)" >> "$root/usr/share/doc/sessiongate/image-packages.txt"

rm -rf "$layout"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack --image "$layout:$tag" "$work/bundle" > /dev/null
cp -a "$root/." "$work/bundle/rootfs/"
umoci repack --image "$layout:$tag" "$work/bundle"
umoci config --image "$layout:$tag" \
  --config.user 10001:10001 \
  --config.entrypoint /usr/local/bin/sessiongate \
  --config.cmd serve --config.cmd --config --config.cmd /etc/sessiongate/sessiongate.yaml \
  --config.workingdir / \
  --config.exposedports 8080/tcp --config.exposedports 9091/tcp \
  --config.volume /etc/sessiongate \
  --config.label org.opencontainers.image.title=sessiongate \
  --config.label "org.opencontainers.image.description=A reverse proxy that admits only Sign in with Apple sessions" \
  --architecture amd64 --os linux
umoci gc --layout "$layout"
echo "image: $layout:$tag ($(du -sh "$layout" | cut -f1)), from $(wc -l < "$root/usr/share/doc/sessiongate/image-packages.txt") Debian packages"
