package kit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFileCreationLeavesItsFiles(t *testing.T) {
	dir := t.TempDir()
	d, err := FileCreation(dir, 20)
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 {
		t.Fatalf("median %v: want a positive time", d)
	}
	got, err := filepath.Glob(filepath.Join(dir, "filecreation-*", "f*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 20 {
		t.Fatalf("%d files left, want the 20 created (deleting them would slow the next creations)", len(got))
	}
	if _, err := FileCreation(filepath.Join(dir, "missing"), 1); !os.IsNotExist(err) {
		t.Fatalf("in a missing directory: %v, want a not-exist error", err)
	}
}

func TestFileCreationLinesWarnOnlyWhenOutputsMeetSlowCreation(t *testing.T) {
	fast, slow := 20*time.Microsecond, 400*time.Microsecond
	for _, c := range []struct {
		before, after time.Duration
		outputs, warn bool
	}{
		{fast, fast, true, false},
		{slow, fast, true, true},
		{fast, slow, true, true},
		{slow, slow, false, false}, // no output files: the figures do not depend on it
	} {
		s := FileCreationLines(c.before, c.after, c.outputs)
		if !strings.HasPrefix(s, "creating a small file in the working directory: ") || !strings.HasSuffix(s, "\n") {
			t.Errorf("%v/%v outputs=%v: %q", c.before, c.after, c.outputs, s)
		}
		if got := strings.Contains(s, "WARNING"); got != c.warn {
			t.Errorf("%v/%v outputs=%v: warning %v, want %v:\n%s", c.before, c.after, c.outputs, got, c.warn, s)
		}
	}
	if s := FileCreationLines(fast, slow, true); !strings.Contains(s, "20 µs before the rounds, 400 µs after") {
		t.Errorf("the figures are not in the line: %q", s)
	}
}
