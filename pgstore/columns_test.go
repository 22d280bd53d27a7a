package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRecordColumnsMatchTheirLines: the columns a record is stored with
// besides its line (ev, stage, attempt, key, session) and its outputs'
// rows say what the line says, for records appended alone and for
// records appended together (8 goroutines: batches of several records,
// whose values go to the server as arrays), with and without outputs,
// stage, attempt, key or session.
func TestRecordColumnsMatchTheirLines(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	run, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "columns"})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 12 {
				name := fmt.Sprintf("g%d/s%d", g, i)
				switch i % 4 {
				case 0:
					assert.NoError(t, run.Skip(ctx, name, "not needed"))
				case 1:
					_, err := run.Effect(ctx, "notify:"+name, runstate.Effect{
						Do: func(context.Context, string) (json.RawMessage, error) { return json.RawMessage(`{"ok":true}`), nil },
					})
					assert.NoError(t, err)
				default:
					assert.NoError(t, run.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
						if err := st.WriteFile("out/"+name+".a", []byte(name)); err != nil {
							return err
						}
						if i%4 == 3 {
							return st.WriteFile("out/"+name+".b", []byte(name+" b"))
						}
						return nil
					}))
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, run.Close())

	rows, err := db.pool.Query(ctx, db.sql(`SELECT r.seq, r.line, r.ev, r.stage, r.attempt, r.key, r.session::text, r.xmin::text,
  coalesce((SELECT json_agg(json_build_object('path', o.path, 'sha256', encode(o.sha256, 'hex'), 'size', o.size) ORDER BY o.path)
            FROM {s}.outputs o WHERE o.run_id = r.run_id AND o.seq = r.seq), '[]')
FROM {s}.records r ORDER BY r.seq`))
	require.NoError(t, err)
	defer rows.Close()
	type output struct {
		Path, SHA256 string
		Size         int64
	}
	n, withOutputs, withKey, withoutAttempt := 0, 0, 0, 0
	perTx := map[string]int{}
	for rows.Next() {
		var (
			seq                 int64
			line                []byte
			ev                  string
			stage, key, session *string
			attempt             *int32
			xmin                string
			outs                []output
		)
		require.NoError(t, rows.Scan(&seq, &line, &ev, &stage, &attempt, &key, &session, &xmin, &outs))
		var rec runstate.Record
		require.NoError(t, json.Unmarshal(line, &rec), "seq %d", seq)
		at := fmt.Sprintf("seq %d (%s)", seq, line)
		assert.Equal(t, rec.Seq, seq, at)
		assert.Equal(t, rec.Ev, ev, at)
		assert.Equal(t, rec.Stage, deref(stage), at)
		assert.Equal(t, rec.Key, deref(key), at)
		assert.Equal(t, rec.Session, deref(session), at)
		if rec.Attempt == 0 {
			assert.Nil(t, attempt, at)
			withoutAttempt++
		} else if assert.NotNil(t, attempt, at) {
			assert.Equal(t, rec.Attempt, int(*attempt), at)
		}
		want := []output{}
		for _, o := range rec.Outputs {
			want = append(want, output{o.Path, o.SHA256, o.Size})
		}
		assert.ElementsMatch(t, want, outs, at)
		if len(outs) > 0 {
			withOutputs++
		}
		if key != nil {
			withKey++
		}
		perTx[xmin]++
		n++
	}
	require.NoError(t, rows.Err())
	together := 0
	for _, c := range perTx {
		if c > 1 {
			together += c
		}
	}
	t.Logf("%d records in %d transactions, %d of them appended with others; %d with outputs, %d with a key, %d without an attempt",
		n, len(perTx), together, withOutputs, withKey, withoutAttempt)
	require.Greater(t, n, 8*12)
	assert.Positive(t, together, "some records were appended together (as arrays)")
	assert.Positive(t, withOutputs)
	assert.Positive(t, withKey)
	assert.Positive(t, withoutAttempt)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
