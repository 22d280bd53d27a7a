# pgtool.sh, sourced by the bench scripts (not run):
#
# tool NAME prints the path of PostgreSQL's program NAME (psql, pgbench):
# the server's binaries first (RUNSTATE_PG_BIN, as ../pgstore/testdb.sh
# sets it), then PATH, then Debian's directories; nothing when none has it.
tool() {
	if [[ -n ${RUNSTATE_PG_BIN:-} && -x $RUNSTATE_PG_BIN/$1 ]]; then
		echo "$RUNSTATE_PG_BIN/$1"
	elif command -v "$1"; then
		:
	else
		ls /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -1 || true
	fi
}
