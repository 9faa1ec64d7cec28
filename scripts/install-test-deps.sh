#!/usr/bin/env bash
# Installs what the tests need when it is missing: redis-server,
# redis-tools and zookeeper (which brings Java) from Debian's packages. Needs root for apt-get; without root it
# says what to install and fails.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
# The ZooKeeper tests run Debian's server jar with java directly.
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; } || need+=(zookeeper)

if [ ${#need[@]} -eq 0 ]; then
	exit 0
fi
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
# Debian's zookeeper package installs no running service by default; the
# tests start their own servers on free ports with the jar.
