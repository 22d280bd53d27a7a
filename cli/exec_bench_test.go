package cli

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// BenchmarkExecTrue measures what runstate exec adds around a command that
// does nothing: "true" alone, exec running it as a stage (its evidence
// expires at once, so each exec redoes the stage: invalidate, begin,
// complete), and exec finding the stage done (skipped). The difference of
// the first two is the overhead the design budgets (< 15 ms).
func BenchmarkExecTrue(b *testing.B) {
	truePath, err := exec.LookPath("true")
	if err != nil {
		b.Skip("no true command")
	}
	dir := filepath.Join(b.TempDir(), "run")
	if out, err := exec.Command(bin, "plan", dir, "-request", "bench", "s").CombinedOutput(); err != nil {
		b.Fatalf("%v: %s", err, out)
	}
	run := func(b *testing.B, argv ...string) {
		for b.Loop() {
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				b.Fatalf("%v: %s", err, out)
			}
		}
	}
	b.Run("true", func(b *testing.B) { run(b, truePath) })
	b.Run("exec", func(b *testing.B) { run(b, bin, "exec", dir, "s", "-valid-for", "1ns", "--", truePath) })
	b.Run("exec-skipped", func(b *testing.B) { run(b, bin, "exec", dir, "done", "--", truePath) })
}
