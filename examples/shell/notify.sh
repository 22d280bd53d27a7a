#!/bin/sh
# notify.sh is the receiving system of the example: a notification is a
# line in OUTBOX that starts with its idempotency key.
#
#   notify.sh send OUTBOX FILE   appends "KEY <last line of FILE>", prints the receipt
#   notify.sh check OUTBOX       exit 0 and print the receipt when KEY is in OUTBOX, 1 when not
#
# KEY is $RUNSTATE_IDEMPOTENCY_KEY, set by 'runstate effect'. NOTIFY_DELAY
# (seconds) makes send wait after appending, before it answers: a window for
# the example's test to kill the pipeline in.
set -eu
key=${RUNSTATE_IDEMPOTENCY_KEY:?run notify.sh through runstate effect}
case $1 in
send)
	echo "$key $(tail -n 1 "$3")" >> "$2"
	sleep "${NOTIFY_DELAY:-0}"
	echo "{\"line\": $(wc -l < "$2")}" ;;
check)
	[ -e "$2" ] || exit 1
	n=$(grep -n -F "$key " "$2" | cut -d: -f1 | head -n 1)
	[ -n "$n" ] || exit 1
	echo "{\"line\": $n}" ;;
*)
	echo "usage: notify.sh send OUTBOX FILE | check OUTBOX" >&2; exit 2 ;;
esac
