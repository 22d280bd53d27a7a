// Command runstate is the runstate command (github.com/runstate/runstate/cmd/runstate)
// with runs stored in PostgreSQL: wherever the read and operator commands
// take DIR (status, log [-follow], verify, next, metrics, export, approve,
// invalidate, resolve) they also take a run address
//
//	postgres://USER@HOST:PORT/DATABASE?run=NAME[&schema=SCHEMA][&sslmode=...]
//
// with the same output and -json shapes as for a run directory. run names
// the run (the name the agents pass to pgstore's DB.Open); schema the
// pgstore schema (default runstate); the other parameters go to the server
// as pgx reads them (a password is better in PGPASSWORD or ~/.pgpass than
// in the URL). The command strips run and schema before pgx sees the DSN.
//
// The read commands take no lock and hold no session; status asks the
// server's pg_locks whether a session's advisory lock is held. log -follow
// polls the run's records every 100 ms (and, while the server does not
// answer, or leaves a read unanswered for 10 s, says so and tries again
// every second). For 10 s after a server restart, status says that it
// cannot tell whether a session opened before it is alive, and when it
// can (pgstore.DB.RestartGrace). export writes the records' lines,
// byte for byte: a valid logs/ledger.jsonl. The operator commands open a
// short session with a temporary local working directory, removed after.
// ls also takes a database's address without run=NAME,
//
//	postgres://USER@HOST:PORT/DATABASE[?schema=SCHEMA]
//
// and lists every run of the schema, each under its address, as it lists
// the run directories under a root (with run=NAME: that run alone).
//
// The pipeline commands (exec, effect, plan, skip, await) take, as DIR,
// this machine's working directory of a run in PostgreSQL: -at ADDRESS
// names the run the first time (with -request TEXT it creates the run,
// connecting with pgstore.Connect, which creates the schema too), and
// DIR's logs/run.json names it after, so that a bash pipeline on several
// machines reads
//
//	runstate plan -at 'postgres://agent@db/agents?run=nightly' ./work -request "nightly build" fetch build
//	runstate exec ./work build -after fetch -out ./work/app -- make app
//
// The stages' files are in DIR and stored in the database with the
// records; an -after stage's outputs made on another machine are put in
// DIR before the command runs. repair works on run directories only.
//
// Build it from a checkout of the repository:
//
//	cd pgstore && go build -o runstate ./cmd/runstate
//
// (go install …@latest cannot build it: pgstore's go.mod has replace
// directives, which go install refuses outside the main module.)
package main

import "github.com/runstate/runstate/cli"

func main() { cli.Main(options()) }

// options are the command's cli.Options: postgres:// and postgresql://
// addresses are runs in PostgreSQL.
func options() *cli.Options {
	return &cli.Options{
		Sources: map[string]cli.Opener{"postgres": openPG, "postgresql": openPG},
		Lists:   map[string]cli.Lister{"postgres": listPG, "postgresql": listPG},
		Runners: map[string]cli.Runner{"postgres": runPG, "postgresql": runPG},
		Usage: `DIR may also be a run in PostgreSQL: postgres://USER@HOST:PORT/DB?run=NAME[&schema=S]
(status, log, verify, next, metrics, export, approve, invalidate, resolve);
ls also takes a database, postgres://USER@HOST:PORT/DB[?schema=S]: its runs;
exec, effect, plan, skip and await take this machine's working directory of
such a run as DIR, with -at ADDRESS the first time.`,
	}
}
