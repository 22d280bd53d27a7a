#!/usr/bin/env bash
# pgfloor.sh: the server's floor under a pgstore checkpoint, as a multiple
# of one raw INSERT transaction (synchronous_commit on), with no client
# work at all: pgbench (one client, prepared statements) runs, in
# alternating rounds,
#   raw     one INSERT of a 300-byte row into a table with a bigserial key;
#   two-tx  a checkpoint's two statements as a session alone on its run
#           sends them (ahead.go), pipelined in one round trip: the begin's
#           bet in a transaction committed with synchronous_commit off,
#           then the complete's bet with its small output's bytes inline,
#           committed with a WAL flush;
#   one-tx  the same two statements in one flushed transaction (what a
#           checkpoint would cost if its begin did not have to be in the
#           database before the stage's work: it does, see ahead.go);
#   batch-K two-tx with K begins in the first transaction and their K
#           completes in the second (BATCH, default 6: the completes a
#           batch carries with 8 goroutines, BenchmarkGoroutines), timed
#           against two-tx as throughput: the most 8g/seq could be if the
#           client cost nothing.
# With VARIANTS=1 it also times two-tx in three forms that pgstore does
# not have, as candidates for a schema version:
#   noout   the complete's output in its record's row: no outputs row
#           (the record's line 50 bytes longer);
#   nohead  no head row: the run's lock taken by pg_advisory_xact_lock and
#           the next seq read from the records' key (max(seq));
#   both    the two together.
# The tables are pgstore's own: its migrations (../pgstore/migrations),
# applied to a scratch schema that the script drops at the end. The bets
# are optimistic.go's statements in the form a session alone on its run
# uses (the head row's UPDATE, the advisory self-fence, the record's row
# with its two partial unique indexes, the output's row), with literals in
# place of parameters, and one difference: the UPDATE moves the head by
# an increment where pgstore compares its seq and hash with the ones it
# bet on (pgbench carries nothing from one transaction to the next; the
# comparison is of two values in the row it updates anyway).
#
#   bench/pgfloor.sh [DSN]        (default: $RUNSTATE_PG_DSN)
#   ROUNDS=6 SECS=4 BATCH=6 bench/pgfloor.sh
#   VARIANTS=1 bench/pgfloor.sh
#
# It prints each round's mean latencies (pgbench's "latency average") and
# their ratios, then the medians of the ratios.
set -euo pipefail

dsn=${1:-${RUNSTATE_PG_DSN:-}}
if [[ -z $dsn ]]; then
	echo "pgfloor.sh: give a DSN (postgres://USER@HOST:PORT/DB) or set RUNSTATE_PG_DSN" >&2
	exit 2
fi
rounds=${ROUNDS:-6}
secs=${SECS:-4}
batch=${BATCH:-6}
if ! [[ $batch =~ ^[0-9]+$ ]] || ((batch < 2)); then
	echo "pgfloor.sh: BATCH is the records of a batch, 2 or more" >&2
	exit 2
fi
# shellcheck source=pgtool.sh
. "$(dirname "$0")/pgtool.sh"
pgbench=$(tool pgbench)
psql=$(tool psql)
if [[ -z $pgbench || -z $psql ]]; then
	echo "pgfloor.sh: no pgbench or psql (Debian: apt-get install postgresql)" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
schema=pgfloor_$$
tmp=$(mktemp -d)
cleanup() {
	"$psql" "$dsn" -qX -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT

{
	echo "CREATE SCHEMA $schema;"
	for m in "$here"/../pgstore/migrations/*.sql; do
		sed "s/{s}/$schema/g" "$m"
	done
	echo "INSERT INTO $schema.runs (id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'floor');"
	echo "CREATE TABLE $schema.raw (id bigserial PRIMARY KEY, line bytea NOT NULL);"
} | "$psql" "$dsn" -qX -v ON_ERROR_STOP=1 >/dev/null

run="'00000000-0000-0000-0000-000000000001'"
session="'00000000-0000-0000-0000-000000000002'"
# head K: the run's head row, moved by K records (an increment in place
# of pgstore's compare-and-set),
# and the session's self-fence (pg_try_advisory_xact_lock_shared of a key
# nobody holds exclusive: the fence passes).
head() {
	echo "WITH head AS (UPDATE $schema.runs SET last_seq = last_seq + $1, last_hash = sha256('\\x02'), last_end = last_end + 300 * $1, last_len = 300, last_at = now() WHERE id = $run RETURNING last_seq, sqrt(CASE WHEN pg_try_advisory_xact_lock_shared(4242) THEN 1 ELSE -1 END) AS fence)"
}
# headless K: head's form without the head row (VARIANTS): the run's
# lock by pg_advisory_xact_lock (void, so compared as text) and the next
# seq from the records' key.
headless() {
	echo "WITH head AS MATERIALIZED (SELECT (SELECT coalesce(max(seq), 0) FROM $schema.records WHERE run_id = $run) + $1 AS last_seq, sqrt(CASE WHEN pg_try_advisory_xact_lock_shared(4242) AND pg_advisory_xact_lock(4343)::text = '' THEN 1 ELSE -1 END) AS fence)"
}
# bet EV LEN K: a bet of K records of event EV (LEN bytes each) after the
# head, each complete with its small output's bytes inline. One record is
# a row of values, as batch.go's one-record statements; K a set, as its
# array form (unnest there, generate_series here).
bet() {
	local seq="head.last_seq" stage="'s-' || :n" from="head"
	if (($3 > 1)); then
		seq="head.last_seq - $3 + i" stage="'s-' || :n || '-' || i" from="head, generate_series(1, $3) i"
	fi
	local out="convert_to('result of ' || $stage || E'\\n', 'UTF8')"
	local sql h
	h=$(head "$3")
	if [[ ${HEADLESS:-} ]]; then
		h=$(headless "$3")
	fi
	sql="$h, ins AS (INSERT INTO $schema.records (run_id, seq, line, hash, ev, stage, attempt, key, session, at) SELECT $run, $seq, convert_to(repeat('x', $2), 'UTF8'), sha256(convert_to(repeat('x', $2), 'UTF8')), '$1', $stage, 1, NULL, $session, now() FROM $from WHERE head.fence = 1)"
	if [[ $1 == complete && -z ${NOOUT:-} ]]; then
		sql+=", outs AS (INSERT INTO $schema.outputs (run_id, seq, path, sha256, size, data) SELECT $run, $seq, 'out/' || $stage || '.txt', sha256($out), length($out), $out FROM $from WHERE head.fence = 1)"
	fi
	echo "$sql SELECT 1 / (SELECT count(*)::int FROM head);"
}
n='\set n random(1, 9000000000000000000)'

# variant NAME HEADLESS NOOUT: two-tx's script (both empty), or one of
# the VARIANTS (each 1 or empty; the record of a complete without its
# output's row is 50 bytes longer, for the output it would carry).
variant() {
	printf '%s\n' "$n" '\startpipeline' 'BEGIN;' 'SET LOCAL synchronous_commit = off;' "$(HEADLESS=$2 NOOUT=$3 bet begin 250 1)" 'COMMIT;' "$(HEADLESS=$2 NOOUT=$3 bet complete $((${3:+50} + 330)) 1)" '\endpipeline' >"$tmp/$1.sql"
}

echo "INSERT INTO $schema.raw (line) VALUES (convert_to(repeat('x', 300), 'UTF8'));" >"$tmp/raw.sql"
variant two-tx "" ""
printf '%s\n' "$n" '\startpipeline' 'BEGIN;' "$(bet begin 250 1)" "$(bet complete 330 1)" 'COMMIT;' '\endpipeline' >"$tmp/one-tx.sql"
printf '%s\n' "$n" '\startpipeline' 'BEGIN;' 'SET LOCAL synchronous_commit = off;' "$(bet begin 250 "$batch")" 'COMMIT;' "$(bet complete 330 "$batch")" '\endpipeline' >"$tmp/batch.sql"
variants=()
if [[ ${VARIANTS:-} ]]; then
	variants=(noout nohead both)
	variant noout "" 1 && variant nohead 1 "" && variant both 1 1
fi
# resync moves the head row to the records' last seq: the nohead forms
# append without it.
resync() { "$psql" "$dsn" -qXAt -c "UPDATE $schema.runs SET last_seq = (SELECT coalesce(max(seq), 0) FROM $schema.records WHERE run_id = $run)" >/dev/null; }

latency() { # script: mean latency in µs
	local us
	us=$("$pgbench" -n -M prepared -c 1 -T "$secs" -f "$tmp/$1.sql" "$dsn" 2>"$tmp/err" | awk '/latency average/ { printf "%d", $4 * 1000 }') || true
	if [[ -z $us ]] || grep -q -i error "$tmp/err"; then
		echo "pgfloor.sh: pgbench failed on $1:" >&2
		cat "$tmp/err" >&2
		exit 1
	fi
	echo "$us"
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "pgbench $("$pgbench" --version | awk '{print $3}'), server $("$psql" "$dsn" -qXAtc 'SHOW server_version'), $rounds rounds of ${secs} s each, $(date -u '+%Y-%m-%d %H:%M UTC')"
: >"$tmp/two" && : >"$tmp/one" && : >"$tmp/batched"
for ((i = 1; i <= rounds; i++)); do
	r=$(latency raw)
	t=$(latency two-tx)
	o=$(latency one-tx)
	b=$(latency batch)
	rt=$(awk -v a="$t" -v b="$r" 'BEGIN { printf "%.2f", a / b }')
	ro=$(awk -v a="$o" -v b="$r" 'BEGIN { printf "%.2f", a / b }')
	rb=$(awk -v a="$t" -v b="$b" -v k="$batch" 'BEGIN { printf "%.2f", a * k / b }')
	echo "$rt" >>"$tmp/two" && echo "$ro" >>"$tmp/one" && echo "$rb" >>"$tmp/batched"
	line="round $i: raw $r µs, two-tx $t µs ($rt x raw), one-tx $o µs ($ro x raw), batch-$batch $b µs ($rb x two-tx's throughput)"
	for v in "${variants[@]}"; do
		u=$(latency "$v")
		rv=$(awk -v a="$u" -v b="$r" 'BEGIN { printf "%.2f", a / b }')
		echo "$rv" >>"$tmp/v.$v"
		line+=", $v $u µs ($rv x raw)"
	done
	if ((${#variants[@]})); then
		resync
	fi
	echo "$line"
done
# Every statement must have written its rows (a fence or an UPDATE
# that failed quietly would have measured less work).
# The completes of the noout forms (their 380-byte records) have no
# output row; every other complete has one.
counts=$("$psql" "$dsn" -qXAt -F ' ' -c "SELECT (SELECT count(*) FROM $schema.records WHERE ev = 'begin'), (SELECT count(*) FROM $schema.records WHERE ev = 'complete'), (SELECT count(*) FROM $schema.records WHERE ev = 'complete' AND length(line) <> 380), (SELECT count(*) FROM $schema.outputs), (SELECT last_seq FROM $schema.runs)")
read -r begins completes withOutput outputs last <<<"$counts"
if ((begins == 0 || begins != completes || withOutput != outputs || last != begins + completes)); then
	echo "pgfloor.sh: the statements did not write what they should: $begins begins, $completes completes ($withOutput with an output row), $outputs outputs, head at $last" >&2
	exit 1
fi
echo "median: two-tx $(median <"$tmp/two") x raw, one-tx $(median <"$tmp/one") x raw, batch-$batch $(median <"$tmp/batched") x two-tx's throughput"
for v in "${variants[@]}"; do
	echo "median: $v $(median <"$tmp/v.$v") x raw"
done
