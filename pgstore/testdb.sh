#!/usr/bin/env bash
# testdb.sh CMD [ARGS...]: start a throwaway PostgreSQL server on 127.0.0.1,
# run CMD with RUNSTATE_PG_DSN (and RUNSTATE_PG_BIN, RUNSTATE_PGBOUNCER) pointing at it, stop the
# server (by its PID, also when CMD fails) and remove its data directory.
#
#   pgstore/testdb.sh go test ./...        # from pgstore/: the pgstore tests
#
# PGPORT picks the port (default 55439). The server binaries are found under
# /usr/lib/postgresql/*/bin or on PATH (pg_ctl); as root on Debian/Ubuntu a
# missing server is installed (apt-get install postgresql), and so is a missing
# pgbouncer (for the tests of poolers). As root the server runs as the
# postgres user.
set -euo pipefail
port="${PGPORT:-55439}"
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$PGBIN" ] && command -v pg_ctl >/dev/null; then PGBIN=$(dirname "$(command -v pg_ctl)"); fi
if [ -z "$PGBIN" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
	PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
if [ -z "$PGBIN" ]; then
	echo "testdb.sh: no PostgreSQL server binaries (initdb, pg_ctl): install the postgresql package" >&2
	exit 1
fi
# pgbouncer, for the tests of poolers (RUNSTATE_PGBOUNCER): installed the same way.
PGBOUNCER=$(command -v pgbouncer || ls /usr/sbin/pgbouncer 2>/dev/null || true)
if [ -z "$PGBOUNCER" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null 2>&1 ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null; }; } || true
	PGBOUNCER=$(command -v pgbouncer || ls /usr/sbin/pgbouncer 2>/dev/null || true)
fi
PGDATA=$(mktemp -d /tmp/runstate-pg.XXXXXX)
as=()
if [ "$(id -u)" = 0 ]; then
	chown postgres:postgres "$PGDATA"
	as=(runuser -u postgres --)
fi
PGPID=
stop() {
	if [ -n "$PGPID" ]; then
		kill -INT "$PGPID" 2>/dev/null || true
		while kill -0 "$PGPID" 2>/dev/null; do sleep 0.1; done
	fi
	rm -rf "$PGDATA"
}
trap stop EXIT
"${as[@]}" "$PGBIN/initdb" -D "$PGDATA" -A trust -U postgres -E UTF8 --no-locale >/dev/null
"${as[@]}" "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w -t 60 \
	-o "-c listen_addresses=127.0.0.1 -p $port -k $PGDATA -c max_connections=200" start >/dev/null
PGPID=$(head -1 "$PGDATA/postmaster.pid")
export RUNSTATE_PG_DSN="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" RUNSTATE_PG_BIN="$PGBIN"
if [ -n "$PGBOUNCER" ]; then export RUNSTATE_PGBOUNCER="$PGBOUNCER"; fi
"$@"
