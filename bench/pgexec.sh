#!/usr/bin/env bash
# pgexec.sh: what one `runstate exec` costs on a run in PostgreSQL (a
# machine's working directory, -at ADDRESS), against the same command on a
# run directory, measured in the same alternating rounds: a stage that is
# done (skipped) and a new stage running `true`. Each command is its own
# process, as in a shell pipeline, so most of the difference is starting
# server connections. With PGBOUNCER_DSN (a pgbouncer in session mode in
# front of the same server) it also measures through the pooler, which
# keeps the server connections between commands.
#
#   bench/pgexec.sh [DSN]        (default: $RUNSTATE_PG_DSN)
#   ROUNDS=40 PGBOUNCER_DSN=postgres://postgres@127.0.0.1:6432/postgres bench/pgexec.sh
#
# It builds the command from ../pgstore, uses a scratch schema that it
# drops at the end, and prints each way's median and 90th percentile in
# ms, and the median's ratio to the run directory's.
set -euo pipefail

dsn=${1:-${RUNSTATE_PG_DSN:-}}
if [[ -z $dsn ]]; then
	echo "pgexec.sh: give a DSN (postgres://USER@HOST:PORT/DB) or set RUNSTATE_PG_DSN" >&2
	exit 2
fi
rounds=${ROUNDS:-20}
if ! [[ $rounds =~ ^[0-9]+$ ]] || ((rounds < 1)); then
	echo "pgexec.sh: ROUNDS is a number of rounds, 1 or more" >&2
	exit 2
fi
# shellcheck source=pgtool.sh
. "$(dirname "$0")/pgtool.sh"
psql=$(tool psql)
if [[ -z $psql ]]; then
	echo "pgexec.sh: no psql, to drop its scratch schema (Debian: apt-get install postgresql-client)" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
schema=pgexec_$$
sep='?'
[[ $dsn == *\?* ]] && sep='&'
rs=$tmp/runstate
cleanup() {
	"$psql" "$dsn" -qX -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
(cd "$here/../pgstore" && go build -o "$rs" ./cmd/runstate)

ways=(dir pg)
declare -A where
where[dir]=$tmp/dir
where[pg]=$tmp/pg
"$rs" plan "${where[dir]}" -request pgexec done >/dev/null
"$rs" plan -at "$dsn${sep}schema=$schema&run=pgexec" "${where[pg]}" -request pgexec done >/dev/null
if [[ -n ${PGBOUNCER_DSN:-} ]]; then
	bsep='?'
	[[ $PGBOUNCER_DSN == *\?* ]] && bsep='&'
	ways+=(pgbouncer)
	where[pgbouncer]=$tmp/pgbouncer
	"$rs" plan -at "$PGBOUNCER_DSN${bsep}schema=$schema&run=pgexec-pooled" "${where[pgbouncer]}" -request pgexec done >/dev/null
fi
for w in "${ways[@]}"; do
	"$rs" exec "${where[$w]}" done -- true 2>/dev/null
done

# ms CMD...: runs CMD and prints its wall time in ms (3 decimals).
ms() {
	local t0 t1
	t0=$(date +%s%N)
	"$@" >/dev/null 2>&1 || { echo "pgexec.sh: failed: $*" >&2; exit 1; }
	t1=$(date +%s%N)
	echo "$(((t1 - t0) / 1000))" | awk '{printf "%.3f\n", $1/1000}'
}

for ((i = 0; i < rounds; i++)); do
	order=("${ways[@]}")
	if ((i % 2)); then # alternate which goes first
		order=()
		for ((j = ${#ways[@]} - 1; j >= 0; j--)); do order+=("${ways[j]}"); done
	fi
	for w in "${order[@]}"; do
		ms "$rs" exec "${where[$w]}" done -- true >>"$tmp/$w.skip"
		ms "$rs" exec "${where[$w]}" "s$i" -- true >>"$tmp/$w.new"
	done
done

# stat FILE: median and 90th percentile of the numbers in FILE.
stat() { sort -n "$1" | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; p=a[int(NR*0.9)>0?int(NR*0.9):1]; printf "%.1f %.1f\n", m, p}'; }

echo "runstate exec on a run directory and on a run in PostgreSQL, $rounds alternating rounds, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
for kind in skip new; do
	read -r base _ < <(stat "$tmp/dir.$kind")
	label="stage done (skipped)"
	[[ $kind == new ]] && label="new stage running true"
	echo "$label:"
	for w in "${ways[@]}"; do
		read -r med p90 < <(stat "$tmp/$w.$kind")
		printf '  %-10s median %7.1f ms  p90 %7.1f ms  %5.2f x the run directory\n' "$w" "$med" "$p90" "$(awk -v a="$med" -v b="$base" 'BEGIN {print a/b}')"
	done
done
