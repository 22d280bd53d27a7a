#!/usr/bin/env bash
# pipeline.sh vets, tests and reports on a Go package, then sends one
# notification: four steps, each through runstate, so that it can be killed
# at any moment and started again. It redoes no step whose evidence holds
# and sends the notification once.
#
# usage: pipeline.sh SRC RUN OUTBOX [ADDRESS]
#   SRC      the Go package (for instance ../../testdata/gopkg)
#   RUN      the run directory; with ADDRESS, this machine's working
#            directory of the run kept there
#   OUTBOX   the file notify.sh appends notifications to
#   ADDRESS  a run kept in PostgreSQL, postgres://...?run=NAME (with the
#            runstate command built from pgstore): machines that run the
#            pipeline with the same ADDRESS, each with its own RUN, share
#            the run
set -euo pipefail
[ $# -eq 3 ] || [ $# -eq 4 ] || { echo "usage: pipeline.sh SRC RUN OUTBOX [ADDRESS]" >&2; exit 2; }
at=(); [ $# -eq 4 ] && at=(-at "$4")
abs() { mkdir -p "$(dirname "$1")" && echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
run=$(abs "$2") outbox=$(abs "$3") notify=$(abs "$0")
notify=${notify%/*}/notify.sh
cd "$1"
in=(); for f in go.mod *.go; do in+=(-in "$f"); done

runstate plan ${at[@]+"${at[@]}"} "$run" -request "vet, test and report on a Go package" vet test report
runstate exec "$run" vet "${in[@]}" -- go vet ./...
runstate exec "$run" test "${in[@]}" -after vet -out "$run/cover.out" -- go test -count=1 -coverprofile "$run/cover.out" ./...
runstate exec "$run" report -after test -- go tool cover -func "$run/cover.out"
# -check is one string that sh runs: printf %q quotes each word for it.
runstate effect "$run" notify:report -check "$(printf '%q ' "$notify" check "$outbox")" -- "$notify" send "$outbox" "$run/exec/report.stdout"
