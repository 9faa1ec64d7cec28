#!/usr/bin/env bash
# Installs what the tests need when it is missing: redis-server and
# redis-tools, python3-redis (test/clients), nutcracker (twemproxy, for the
# passthrough benchmark) and nodejs/npm from Debian's packages, then the
# npm packages of test/clients/node (ioredis, node-redis) from its
# package-lock.json. Needs root for apt-get; without root it says what to
# install and fails.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v nutcracker >/dev/null 2>&1 || need+=(nutcracker)
/usr/bin/python3 -c 'import redis' >/dev/null 2>&1 || need+=(python3-redis)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "missing: ${need[*]}; install them with: sudo apt-get install -y ${need[*]}" >&2
		exit 1
	fi
	echo "installing ${need[*]} from Debian's packages" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	# Debian's package starts a redis-server on 6379; the tests start their own
	# on free ports, so leave the service alone but do not depend on it.
fi

node_dir="$(dirname "$0")/../test/clients/node"
if [ ! -d "$node_dir/node_modules/ioredis" ] || [ ! -d "$node_dir/node_modules/redis" ]; then
	echo "installing the npm packages of test/clients/node" >&2
	(cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
fi
