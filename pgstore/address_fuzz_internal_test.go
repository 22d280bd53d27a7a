package pgstore

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// FuzzAddressReadsBack: the address DB.Address prints for a run (in
// errors, in the command's output, for an operator to paste back) reads
// back as it was meant, whatever the run's, the schema's, the user's and
// the database's names hold ('&', '=', '#', '%', '+', '?', '/', '@',
// spaces, any script): our own Connect does not refuse it as ambiguous,
// the schema parameter comes out as the schema, pgx reads the same user,
// database and hosts, and the run parameter is the run. A name the
// library refuses anyway (a run name that is not one, a schema name
// PostgreSQL cannot have) is out of the domain.
func FuzzAddressReadsBack(f *testing.F) {
	for _, s := range []struct {
		run, schema, user, database string
		hosts                       uint8
	}{
		{"billing-2026-11-29", "runstate", "agent", "agents", 0},
		{"a&b=c#d", "s p", "me@example.com", "db/x?y", 1},
		{"50% + 1", "Schéma", "u:v", "d#b", 2},
		{"run?run=x&schema=y", "a&b", "/", "%2F", 3},
		{"日本語 run", "x", "u", "d", 4},
	} {
		f.Add(s.run, s.schema, s.user, s.database, s.hosts)
	}
	f.Fuzz(func(t *testing.T, run, schema, user, database string, which uint8) {
		if checkRunName(run) != nil || checkSchemaName(schema) != nil || !plainName(user) || !plainName(database) {
			return
		}
		var dsn string
		switch which % 5 {
		case 0:
			dsn = "postgres://127.0.0.1:5432/x"
		case 1:
			dsn = "postgres://[::1]:6432/x"
		case 2:
			dsn = "postgres://db1.example:5432,db2.example:5433/x"
		case 3:
			dsn = "postgres:///x?host=/var/run/postgresql&port=5432"
		case 4:
			dsn = "postgres:///x?host=/tmp/a,/tmp/b&port=5432,5433"
		}
		cfg, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Database = user, database
		db := &DB{schema: schema, lockCfg: &pgx.ConnConfig{Config: *cfg}}
		addr := db.Address(run)

		if err := checkUserinfo(addr); err != nil {
			t.Fatalf("%s: Connect would refuse it: %v", addr, err)
		}
		if strings.ContainsFunc(addr, func(r rune) bool { return r <= ' ' || r >= utf8.RuneSelf }) {
			t.Fatalf("%q: a space, a control character or a byte beyond ASCII in the address", addr)
		}
		rest, gotRun, err := cutRun(addr)
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		if gotRun != run {
			t.Fatalf("%s: run %q, want %q", addr, gotRun, run)
		}
		rest, gotSchema, err := splitSchema(rest)
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		if want := schema; want == DefaultSchema {
			if gotSchema != "" {
				t.Fatalf("%s: schema %q, want none (the default)", addr, gotSchema)
			}
		} else if gotSchema != want {
			t.Fatalf("%s: schema %q, want %q", addr, gotSchema, want)
		}
		got, err := pgconn.ParseConfig(rest)
		if err != nil {
			t.Fatalf("%s: pgx cannot read it: %v", addr, err)
		}
		if got.User != user || got.Database != database {
			t.Fatalf("%s: user %q, database %q; want %q, %q", addr, got.User, got.Database, user, database)
		}
		if g, w := hosts(got), hosts(cfg); strings.Join(g, ",") != strings.Join(w, ",") {
			t.Fatalf("%s: hosts %v, want %v", addr, g, w)
		}
	})
}

// plainName reports whether s can be a PostgreSQL user's or database's
// name given in a DSN: not empty (pgx would put its default in), valid
// UTF-8, no control character (a NUL ends it on the wire).
func plainName(s string) bool {
	return s != "" && utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}
