package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// outboxDo is a Do command that appends the idempotency key to outbox
// (the receiving system) and prints a receipt.
func outboxDo(outbox string) []string {
	return []string{"sh", "-c", `echo "$RUNSTATE_IDEMPOTENCY_KEY" >> "$0"; echo "sent $RUNSTATE_EFFECT"`, outbox}
}

// outboxCheck finds the key in outbox.
func outboxCheck(outbox string) string {
	return `grep -qx "$RUNSTATE_IDEMPOTENCY_KEY" ` + quoteArg(outbox) + ` && echo '{"found":true}'`
}

// An effect runs once; a confirmed key prints its receipt and runs nothing.
func TestEffectOnce(t *testing.T) {
	dir, work := shellRun(t, "report")
	outbox := filepath.Join(work, "outbox")
	for range 3 {
		r := runCLI(t, append([]string{"effect", dir, "notify:PR-1", "--"}, outboxDo(outbox)...)...)
		require.Equal(t, 0, r.code, r.err)
		assert.Equal(t, `"sent notify:PR-1"`+"\n", r.out, "the receipt, text stored as a JSON string")
	}
	b, err := os.ReadFile(outbox)
	require.NoError(t, err)
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, st.ID+":notify:PR-1\n", string(b), "sent once, with the full key")
	assert.JSONEq(t, `"sent notify:PR-1"`, string(receiptOf(t, dir, "notify:PR-1")))
}

// A session killed between the intent and the receipt leaves the effect
// ambiguous: -check settles it (found: not sent again; not found: sent
// again); without a check, or when it cannot tell, a person decides.
func TestEffectAmbiguous(t *testing.T) {
	dir, work := shellRun(t, "report")
	outbox := filepath.Join(work, "outbox")
	kill := func(key string, send bool) {
		marker := filepath.Join(work, "marker-"+key)
		script := `touch "$1"; sleep 60`
		if send {
			script = `echo "$RUNSTATE_IDEMPOTENCY_KEY" >> "$0"; ` + script
		}
		b := startCLI(t, "effect", dir, key, "--", "sh", "-c", script, outbox, marker)
		waitFile(t, marker)
		b.stop(t)
	}
	effect := func(key string, check string) result {
		args := []string{"effect", dir, key}
		if check != "" {
			args = append(args, "-check", check)
		}
		return runCLI(t, append(append(args, "--"), outboxDo(outbox)...)...)
	}

	kill("landed", true)
	r := effect("landed", outboxCheck(outbox))
	require.Equal(t, 0, r.code, r.err)
	assert.Equal(t, `{"found":true}`+"\n", r.out, "the check's receipt")

	kill("lost", false)
	r = effect("lost", outboxCheck(outbox))
	require.Equal(t, 0, r.code, r.err)
	assert.Equal(t, `"sent lost"`+"\n", r.out, "not found: sent again")

	kill("unknown", false)
	r = effect("unknown", "exit 5")
	assert.Equal(t, exitPerson, r.code, r.err)
	assert.Contains(t, r.err, "runstate resolve "+dir+" unknown -sent RECEIPT|-not-sent -by NAME")
	r = effect("unknown", "")
	assert.Equal(t, exitPerson, r.code, "no check: a person decides: %s", r.err)
	assert.Contains(t, r.err, "no Check to ask the receiving system")
	assert.Contains(t, r.err, "runstate effect: unknown: give -check CMD, and the next effect asks the receiving system whether it landed")
	// A command that fails (it may have landed) without -check: the
	// library's "Check" is named as the command's -check.
	r = runCLI(t, "effect", dir, "failed", "--", "sh", "-c", "exit 3")
	assert.Equal(t, exitPerson, r.code, r.err)
	assert.Contains(t, r.err, "it has no Check to ask whether it landed: resolve it with: runstate resolve")
	assert.Contains(t, r.err, "runstate effect: failed: give -check CMD, and the next effect asks the receiving system whether it landed")
	assert.NotContains(t, r.err, "call Effect again")

	b, err := os.ReadFile(outbox)
	require.NoError(t, err)
	keys := strings.Fields(string(b))
	require.Len(t, keys, 2, "landed once (before the kill), lost once (after the check)")
	assert.True(t, strings.HasSuffix(keys[0], ":landed"))
	assert.True(t, strings.HasSuffix(keys[1], ":lost"))
}

// The same key with another -payload is refused, and nothing is sent.
func TestEffectPayloadMismatch(t *testing.T) {
	dir, work := shellRun(t, "report")
	outbox := filepath.Join(work, "outbox")
	send := func(payload string) result {
		return runCLI(t, append([]string{"effect", dir, "ticket", "-payload", payload, "--"}, outboxDo(outbox)...)...)
	}
	require.Equal(t, 0, send(`{"title":"a"}`).code)
	r := send(`{"title":"b"}`)
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Contains(t, r.err, "recorded with another request")
	assert.Equal(t, 1, lines(t, outbox))
}

// A command that exists but cannot be started (a #! line naming no
// interpreter) did not run: the effect is not left unconfirmed ("may have
// landed") but recorded as not sent, exit 126 says what to fix, and once
// fixed the next effect sends it.
func TestEffectCommandThatCannotStart(t *testing.T) {
	dir, work := shellRun(t, "report")
	script := filepath.Join(work, "send")
	require.NoError(t, os.WriteFile(script, []byte("#!/no/such/interpreter\necho sent\n"), 0o755))
	r := runCLI(t, "effect", dir, "notify", "--", script)
	assert.Equal(t, exitCannot, r.code, r.err)
	assert.Contains(t, r.err, "could not be started")
	assert.Contains(t, r.err, "it did not run (recorded as not sent): check that it is an executable file and that its #! line names an interpreter that exists")
	assert.NotContains(t, r.err, "may have landed")
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	require.Len(t, st.Effects, 1)
	assert.Equal(t, runstate.EffectNotSent, st.Effects[0].State)

	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho sent\n"), 0o755))
	r = runCLI(t, "effect", dir, "notify", "--", script)
	require.Equal(t, 0, r.code, r.err)
	assert.Equal(t, `"sent"`+"\n", r.out)
}

// An effect whose command landed (it exited 0 and printed a receipt) but
// whose confirmation cannot be recorded (here the ledger was damaged
// meanwhile; for a run in PostgreSQL, a server that stayed down) exits
// 125 and says the receipt and how to record it: the receipt is not lost
// with the write.
func TestEffectWhoseConfirmationFailsSaysItsReceipt(t *testing.T) {
	dir, _ := shellRun(t, "report")
	r := runCLI(t, "effect", dir, "ticket:7", "--", "sh", "-c", `printf '{"seq":99}\n' >> "$RUNSTATE_DIR/logs/ledger.jsonl"; echo '{"ticket": 42}'`)
	assert.Equal(t, exitRunstate, r.code, r.err)
	assert.Empty(t, r.out, "no receipt on standard output: it is not recorded")
	assert.Contains(t, r.err, `runstate effect: ticket:7: the command exited 0 and printed the receipt {"ticket": 42}: the effect landed, but its confirmation is not recorded`)
	assert.Contains(t, r.err, `runstate resolve `+quoteArg(dir)+` ticket:7 -sent '{"ticket": 42}' -by NAME`)
}
