package cli

import (
	"context"
	"flag"
	"fmt"
)

var exportCmd = &command{
	name:     "export",
	synopsis: "DIR",
	short:    "the ledger as exact JSONL (a valid logs/ledger.jsonl) on standard output",
	long: `Export writes the ledger of the run at DIR (a run directory or, in a
command built with other stores, an address) to standard output: every
complete record line, byte for byte as stored, each ending in a newline,
the hash chain and each line's crc checked as it is read. The output is a valid
logs/ledger.jsonl: put it in DIR2/logs/ and 'runstate verify DIR2' checks
the ledger as it checks any run's (the artifacts are not copied). A torn last
line is not written. It takes no lock and writes nothing to the run.

It writes the records that status and log show: in a run directory after a
machine crash (a power loss), the acknowledged records that only
logs/ledger.wal holds, which the ledger lost and the next session copies
back, are written in their place, as the same lines.

Exit status 1, after the lines that checked out, when the ledger is
damaged; the error names the line. Exit status 1 too, with nothing
written, when the ledger holds no record (emptied, or a run whose
creation never finished): that is no run, not an empty one.`,
	min: 1, max: 1,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		return func(c *cli, args []string) int { return c.onSource(args[0], c.export) }
	},
}

func (c *cli) export(ctx context.Context, src Source) int {
	n, err := src.Export(ctx, c.out)
	if err == nil && n == 0 {
		// No record is no run (an emptied ledger, a run never created),
		// not an empty export: Inspect says which, as status does.
		_, err = src.Inspect(ctx)
	}
	if err != nil && n > 0 {
		err = fmt.Errorf("%w (%d records written before it)", err, n)
	}
	if err != nil {
		return c.fail(err)
	}
	return exitOK
}
