#!/bin/sh
# System packages the tests use: a real Redis server (cache tests) and Debian's Chromium (dashboard
# browser test). Installed with apt-get when missing (as root, or with passwordless sudo);
# otherwise this says what to install, and those tests skip with that reason.
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo"
else
    echo "system-deps: please install$missing (e.g. sudo apt-get install$missing); their tests will skip" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: no apt-get here: please install$missing; their tests will skip" >&2
    exit 0
fi
echo "installing:$missing"
$as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq $missing >/dev/null \
    || echo "system-deps: installing$missing failed; their tests will skip" >&2
