// Command runstate shows and operates the run directories that the runstate
// library writes: what a run has done, what blocks it, whether its files
// hold together, and the few things a person does to a run (approve a
// review, invalidate a stage, settle a side effect, repair a torn ledger).
//
// Usage:
//
//	runstate COMMAND [flags] DIR [args]
//
// The read commands (status, log, verify, next, metrics, export) take no
// lock and write nothing, so they are safe to run while agents work on the
// run; each but export takes -json for a stable machine-readable shape.
// The operator commands (approve, invalidate, resolve) append one ledger
// record each, through the library, exactly as the agent's own calls
// would. repair cuts a torn ledger tail and rebuilds the projections. The
// pipeline commands (exec, effect, plan, skip, await) let a program in any
// language write a run: a command as a stage, a side effect once. ls lists
// many runs. The writing commands wait for the ledger lock at most
// -timeout (30s by default); when they give up they say which process
// holds it.
//
// Exit status: 0 when all is well; 1 when a check failed or the command
// could not do what was asked; 2 for a usage error; 3 when status or ls
// finds something that blocks a run; exec, effect and await have their own
// (121-127, and exec passes on its command's). Messages go to standard
// error.
//
// Run 'runstate help' for the commands and 'runstate help COMMAND' (or
// 'runstate COMMAND -h') for one of them. README.md has examples.
//
// This command reads run directories. The same command for runs stored in
// PostgreSQL, which also takes postgres://…?run=NAME wherever it takes
// DIR, is github.com/runstate/runstate/pgstore/cmd/runstate; both are thin
// mains over the package github.com/runstate/runstate/cli.
package main

import "github.com/runstate/runstate/cli"

func main() { cli.Main(nil) }
