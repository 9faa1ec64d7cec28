#!/usr/bin/env bash
# Installs what the tests need when it is missing, from Debian's packages:
# redis-server and redis-tools; zookeeper (which brings Java) for the
# ZooKeeper backend's tests; python3-redis (redis-py, used through Debian's
# /usr/bin/python3), nodejs/npm for the client tests, nutcracker
# (twemproxy) for the passthrough benchmark, systemd (systemd-analyze) and
# prometheus (promtool) for the deploy files' checks; then the npm
# packages of the test directories that have a package-lock.json (npm ci).
# Needs root for apt-get; without root it says what to install and fails.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
# The ZooKeeper tests run Debian's server jar with java directly.
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; } || need+=(zookeeper)
# The Python tests run Debian's python3, which a pyenv or venv python3
# earlier on PATH would hide.
if ! { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import redis' >/dev/null 2>&1; }; then
	need+=(python3 python3-redis)
fi
command -v nutcracker >/dev/null 2>&1 || need+=(nutcracker)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# The unit file in deploy/systemd is checked with systemd-analyze verify,
# the alerting rules in deploy/prometheus with promtool.
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || need+=(postgresql) # test/postgres runs initdb and postgres from there

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "missing: ${need[*]}; install them with: sudo apt-get install -y ${need[*]}" >&2
		exit 1
	fi
	echo "installing ${need[*]} from Debian's packages" >&2
	export DEBIAN_FRONTEND=noninteractive
	# The packages' services (redis on 6379, zookeeper, prometheus on 9090)
	# are not wanted: the tests start their own on free ports. Where no
	# policy says otherwise, one that refuses service starts is put in place
	# for the install and taken away after it (marked, so that one left
	# behind by a killed run is recognised and removed by the next).
	policy=/usr/sbin/policy-rc.d
	marker='# lockproxy install-test-deps.sh'
	if [ -e "$policy" ] && grep -qF "$marker" "$policy"; then
		rm -f "$policy"
	fi
	ours=""
	if [ ! -e "$policy" ]; then
		ours=1
		trap 'rm -f "$policy"' EXIT
		printf '#!/bin/sh\n%s\nexit 101\n' "$marker" >"$policy"
		chmod 755 "$policy"
	fi
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	if [ -n "$ours" ]; then
		rm -f "$policy"
		trap - EXIT
	fi
fi

root="$(cd "$(dirname "$0")/.." && pwd)"
for lock in "$root"/test/*/node/package-lock.json; do
	[ -f "$lock" ] || continue
	dir="$(dirname "$lock")"
	if [ ! -d "$dir/node_modules" ] || [ "$lock" -nt "$dir/node_modules" ]; then
		echo "installing the npm packages of ${dir#"$root"/}" >&2
		(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
	fi
done
