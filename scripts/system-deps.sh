#!/bin/sh
# System packages the tests use: a real Redis server (cache tests) and Debian's Chromium (dashboard
# browser test). Installed with apt-get when missing and we are root; otherwise say what to install.
set -e
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
else
    echo "please install:$missing (e.g. sudo apt-get install$missing)" >&2
    exit 1
fi
