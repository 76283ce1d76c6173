#!/usr/bin/env bash
# Makes the Debian 12 base images the Dockerfile starts FROM (debian:12, debian:12-slim)
# without a registry: `debootstrap --variant=minbase bookworm` into a folder, then
# `docker import`. Both tags name the same minbase root file system, which is what the
# registry's debian:12 is made of (slim differs only by dropping docs and locales).
#
# Done once: an image already labelled as ours is kept, so later runs reuse it. An image of
# those names from elsewhere (a registry pull) is kept too, and said so.
#
# Usage: base_image.sh DOCKER MIRROR
set -euo pipefail
docker="$1"
mirror="$2"
label=org.tensord.base-image=debootstrap-bookworm-minbase

for tag in debian:12 debian:12-slim; do
  if "$docker" image inspect "$tag" >/dev/null 2>&1; then
    if "$docker" image inspect -f '{{index .Config.Labels "org.tensord.base-image"}}' "$tag" \
        | grep -q debootstrap; then
      echo "base_image: $tag exists (made by debootstrap earlier); reusing it"
    else
      echo "base_image: $tag exists and was not made here (a registry pull?); using it as is"
    fi
    continue
  fi
  root=$(mktemp -d /var/tmp/tensord-bookworm.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  echo "base_image: debootstrap --variant=minbase bookworm $root $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror"
  # The sources the registry's image has: the release, its updates and security.
  rm -f "$root/etc/apt/sources.list"
  cat > "$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: ${mirror}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  # What the registry's images set: no recommends kept in the package cache, no docs.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | "$docker" import \
    --change "LABEL $label" --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$tag"
  rm -rf "$root"
  trap - EXIT
  # The second tag is the same image.
  other=debian:12-slim
  [ "$tag" = debian:12-slim ] && other=debian:12
  "$docker" image inspect "$other" >/dev/null 2>&1 || "$docker" tag "$tag" "$other"
done
"$docker" image ls --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' | grep '^debian:12'
