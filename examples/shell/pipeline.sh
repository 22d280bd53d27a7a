#!/usr/bin/env bash
# pipeline.sh vets, tests and reports on a Go package, then sends one
# notification: four steps, each through runstate, so that it can be killed
# at any moment and started again. It redoes no step whose evidence holds
# and sends the notification once.
#
# usage: pipeline.sh SRC RUN OUTBOX
#   SRC     the Go package (for instance ../../testdata/gopkg)
#   RUN     the run directory
#   OUTBOX  the file notify.sh appends notifications to
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: pipeline.sh SRC RUN OUTBOX" >&2; exit 2; }
abs() { mkdir -p "$(dirname "$1")" && echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
run=$(abs "$2") outbox=$(abs "$3") notify=$(abs "$0")
notify=${notify%/*}/notify.sh
cd "$1"
in=(); for f in go.mod *.go; do in+=(-in "$f"); done

runstate plan "$run" -request "vet, test and report on a Go package" vet test report
runstate exec "$run" vet "${in[@]}" -- go vet ./...
runstate exec "$run" test "${in[@]}" -after vet -out "$run/cover.out" -- go test -count=1 -coverprofile "$run/cover.out" ./...
runstate exec "$run" report -after test -- go tool cover -func "$run/cover.out"
runstate effect "$run" notify:report -check "'$notify' check '$outbox'" -- "$notify" send "$outbox" "$run/exec/report.stdout"
