package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore"
)

// The README tells a newcomer to run this example. This test runs the built
// program on a schema of its own and checks, from the database and the
// machines' directories rather than from what the program printed, that it
// did what it says: one machine killed in the middle of a stage, that stage
// done again by another, every stage completed once, and the report made of
// the outputs of the other machines, fetched into its own directory.
func TestFleet(t *testing.T) {
	dsn := os.Getenv("RUNSTATE_PG_DSN")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("RUNSTATE_PG_DSN is not set under CI=true: .ci/run must export it")
		}
		t.Skip("RUNSTATE_PG_DSN is not set; run: cd pgstore && ./testdb.sh go test ./examples/fleet")
	}
	dsn = withSchema(t, dsn)
	bin := filepath.Join(t.TempDir(), "fleet")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)

	dir := t.TempDir()
	out, err = exec.Command(bin, "-dsn", dsn, "-run", "fleet-test", "-dir", dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("the program printed:\n%s", out)

	// What the program said of the doomed machine: its session and its stage.
	doomedSession := regexp.MustCompile(`(?m)^m3: session (\S+)$`).FindSubmatch(out)
	doomedStage := regexp.MustCompile(`(?m)^m3: (shard-\d+): working \(this machine dies now\)$`).FindSubmatch(out)
	require.NotNil(t, doomedSession, "m3 printed its session")
	require.NotNil(t, doomedStage, "m3 began a stage")
	killed := string(doomedStage[1])

	ctx := context.Background()
	db, err := pgstore.ConnectReadOnly(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	st, err := db.Inspect(ctx, "fleet-test")
	require.NoError(t, err)
	names := append(shards(), "report")
	assert.Equal(t, names, st.Plan)
	for _, name := range names {
		s, ok := st.Stage(name)
		require.True(t, ok, name)
		assert.Equal(t, runstate.StateComplete, s.State, name)
		if name == killed {
			assert.Equal(t, 2, s.Attempt, "%s: the killed attempt and the one that completed it", name)
			assert.NotEqual(t, string(doomedSession[1]), s.Session, "%s was completed by another machine", name)
		} else {
			assert.Equal(t, 1, s.Attempt, name)
		}
	}

	// The records: one complete a stage, and the killed attempt recorded as interrupted.
	var ledger bytes.Buffer
	require.NoError(t, db.Export(ctx, "fleet-test", &ledger))
	completes := map[string]int{}
	var interrupted []string
	sc := bufio.NewScanner(&ledger)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		rec, _, err := runstate.DecodeLine(sc.Bytes())
		require.NoError(t, err)
		switch rec.Ev {
		case "complete":
			completes[rec.Stage]++
		case "interrupted":
			interrupted = append(interrupted, rec.Stage)
		}
	}
	require.NoError(t, sc.Err())
	for _, name := range names {
		assert.Equal(t, 1, completes[name], "complete records of %s", name)
	}
	assert.Equal(t, []string{killed}, interrupted)
	rep, err := db.Verify(ctx, "fleet-test", pgstore.RehashBlobs())
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%+v", rep.Problems)

	// The report: in the directory of the machine that made it, each shard's
	// line the bytes of that shard's output in the directory of the machine
	// that counted it, and the total the words of the whole text.
	machines := map[string]string{} // session -> machine, as the machines printed them
	for _, m := range regexp.MustCompile(`(?m)^(m\d+): session (\S+)$`).FindAllSubmatch(out, -1) {
		machines[string(m[2])] = string(m[1])
	}
	rs, _ := st.Stage("report")
	reporter := machines[rs.Session]
	require.NotEmpty(t, reporter, "the report's session %s is one the machines printed", rs.Session)
	report, err := os.ReadFile(filepath.Join(dir, reporter, "report.txt"))
	require.NoError(t, err)
	// A machine that tried the report once it was done has it too (Do
	// restores a done stage's missing outputs from the database): the same bytes.
	copies, err := filepath.Glob(filepath.Join(dir, "*", "report.txt"))
	require.NoError(t, err)
	for _, c := range copies {
		data, err := os.ReadFile(c)
		require.NoError(t, err)
		assert.Equal(t, string(report), string(data), c)
	}
	lines := strings.Split(strings.TrimSuffix(string(report), "\n"), "\n")
	require.Len(t, lines, len(shards())+1, "%s", report)
	elsewhere := 0
	for i, shard := range shards() {
		made := regexp.MustCompile(` on (m\d+)$`).FindStringSubmatch(lines[i])
		require.NotNil(t, made, lines[i])
		data, err := os.ReadFile(filepath.Join(dir, made[1], "shards", shard+".txt"))
		require.NoError(t, err, "the output of %s on the machine that counted it", shard)
		assert.Equal(t, shard+": "+string(data), lines[i]+"\n")
		if made[1] != reporter {
			elsewhere++
			here, err := os.ReadFile(filepath.Join(dir, reporter, "shards", shard+".txt"))
			require.NoError(t, err, "%s, counted on %s, is in %s's directory too", shard, made[1], reporter)
			assert.Equal(t, data, here)
		}
	}
	assert.Positive(t, elsewhere, "the report read outputs made on other machines")
	assert.Equal(t, "total: "+strconv.Itoa(len(strings.Fields(Text)))+" words", lines[len(lines)-1])

	// Run again under the same name: refused, naming what to do, and nothing recorded.
	again, err := exec.Command(bin, "-dsn", dsn, "-run", "fleet-test", "-dir", t.TempDir()).CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(again), "run fleet-test exists already, with 9 stages done: pass -run with another name")
	after, err := db.Inspect(ctx, "fleet-test")
	require.NoError(t, err)
	assert.Equal(t, st.Seq, after.Seq, "the refused run recorded nothing")
}

// Without a server the program says how to get one, and exits 2.
func TestFleetWithoutServer(t *testing.T) {
	if os.Getenv("RUNSTATE_FLEET_CHILD") == "1" {
		os.Args = []string{"fleet"}
		main()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestFleetWithoutServer$")
	cmd.Env = append(os.Environ(), "RUNSTATE_FLEET_CHILD=1", "RUNSTATE_PG_DSN=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "%v: %s", err, stderr.Bytes())
	assert.Equal(t, 2, exit.ExitCode())
	assert.Contains(t, stderr.String(), "./testdb.sh go run ./examples/fleet")
}

// withSchema gives the DSN a new schema of the test's own, dropped at its end.
func withSchema(t *testing.T, dsn string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "fleet_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	})
	if strings.Contains(dsn, "?") {
		return dsn + "&schema=" + schema
	}
	return dsn + "?schema=" + schema
}
