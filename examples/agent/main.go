// Command agent is a realistic runstate example: a coding agent that adds
// doc comments to the exported declarations of a small Go package
// (testdata/gopkg), following runstate.AgentFlow:
//
//	inspect → plan → execute/<file>… → verify → await-review → complete
//
// verify runs go vet and go test on the edited package and records their
// output as an artifact; await-review waits for a person; complete files a
// ticket with a ticket service that honours Idempotency-Key, as a side
// effect that must happen once (runstate.Effect).
//
// Run it from the repository root; run it again after any interruption and
// it picks up where the last session stopped:
//
//	go run ./examples/agent -dir /tmp/agent-run                  # stops at the review
//	go run ./cmd/runstate approve /tmp/agent-run await-review -by you
//	go run ./examples/agent -dir /tmp/agent-run                  # files the ticket
//
// The source package is never modified: the edited copy is written to
// DIR/work/<package>/. The ticket service runs in-process by default,
// keeping its tickets in DIR/ticketd/tickets.json; -ticketd URL uses one
// started with `go run ./examples/agent/ticketd`. -crash-at before-post or
// after-post ends the agent at that point of the ticket's side effect, as a
// kill would (-crash-how hang waits there for your kill -9 instead), to
// show that the next session files no second ticket.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(realMain(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// realMain runs the agent with the command line args and returns the exit
// status: 0 done or waiting for a person's review, 1 an error, 2 bad usage.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config{out: stdout}
	fs.StringVar(&cfg.dir, "dir", "", "run directory (created on the first run, resumed after)")
	fs.StringVar(&cfg.src, "src", "testdata/gopkg", "the Go package to work on (read only)")
	fs.StringVar(&cfg.ticketd, "ticketd", "", "URL of a ticket service (go run ./examples/agent/ticketd); empty runs one in-process")
	fs.StringVar(&cfg.ticketsDB, "tickets-db", "", "where the in-process ticket service keeps its tickets (default DIR/ticketd/tickets.json)")
	fs.StringVar(&cfg.approveAs, "approve-as", "", "approve the review as `NAME` instead of waiting for a person (demo)")
	fs.StringVar(&cfg.crashAt, "crash-at", os.Getenv("AGENT_CRASH_AT"), "end the agent abruptly at `POINT`: before-post (the ticket's intent is recorded, nothing sent) or after-post (the service filed it, no confirmation recorded); default $AGENT_CRASH_AT")
	fs.StringVar(&cfg.crashHow, "crash-how", envOr("AGENT_CRASH_HOW", "exit"), "at the crash point: exit (at once, like a kill) or hang (print the pid and wait for kill -9); default $AGENT_CRASH_HOW or exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./examples/agent -dir DIR [flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.dir == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	switch cfg.crashAt {
	case "", crashBeforePost, crashAfterPost:
	default:
		fmt.Fprintf(stderr, "agent: -crash-at %q: want %s or %s\n", cfg.crashAt, crashBeforePost, crashAfterPost)
		return 2
	}
	if cfg.crashHow != "exit" && cfg.crashHow != "hang" {
		fmt.Fprintf(stderr, "agent: -crash-how %q: want exit or hang\n", cfg.crashHow)
		return 2
	}
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(stderr, "agent:", err)
		return 1
	}
	return 0
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
