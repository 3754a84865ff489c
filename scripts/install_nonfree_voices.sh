#!/usr/bin/env bash
# Installs the synthesis engines Debian keeps outside main: MBROLA and its Mandarin voice cn1 (mbrola in
# contrib, mbrola-cn1 in non-free; corpus.heldout_engine: mbrola), its English voices us1, us2, us3 and en1
# (non-free; corpus engine mbrola in English, spoken through Debian's espeak-ng) and SVOX Pico's English
# voices (libttspico-utils, non-free; corpus engine pico). Adds the contrib and non-free components of the
# system's own Debian release when they are not enabled yet. Run as root, or with sudo available.
set -euo pipefail
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
. /etc/os-release
if ! apt-cache policy mbrola-cn1 2>/dev/null | grep -q Candidate:.*[0-9]; then
    $sudo tee /etc/apt/sources.list.d/kwsflow-contrib-non-free.sources >/dev/null <<SOURCES
Types: deb
URIs: http://deb.debian.org/debian
Suites: ${VERSION_CODENAME}
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends mbrola mbrola-cn1 \
    mbrola-us1 mbrola-us2 mbrola-us3 mbrola-en1 espeak-ng libttspico-utils
