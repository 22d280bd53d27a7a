package runstate

import "fmt"

// Reasons an attempt runs (Stage.Reason), besides the ones quoted from
// the records that Begin writes or finds.
const (
	reasonFirst = "first attempt"
	// reasonHolds is the reason of the notice OnRecord gets when Begin
	// finds a stage done (see Options.OnRecord).
	reasonHolds = "done, evidence holds"
)

// attemptReason says why the attempt that Begin is about to record runs:
// recs are the records Begin writes before the begin (an invalidate, an
// interrupted attempt), st the stage as the state has it.
func attemptReason(st *StageStatus, recs []*Record) string {
	for _, rec := range recs {
		switch rec.Ev {
		case evInvalidate:
			return rec.Reason
		case evInterrupted:
			return fmt.Sprintf("attempt %d was interrupted: %s", rec.Attempt, rec.Reason)
		}
	}
	switch {
	case st.State == StateFailed:
		return fmt.Sprintf("attempt %d failed: %s; retrying", st.Attempt, oneLine(st.Error))
	case st.Reason != "":
		// invalidated (the reason names the input, the output, the
		// expiry or the operator's words), interrupted, or approved
		return st.Reason
	case st.Attempt == 0:
		return reasonFirst
	}
	return fmt.Sprintf("attempt %d did not end", st.Attempt)
}

// Reason says why this attempt runs, as its begin record does: "first
// attempt"; "input src/parser.go changed" (or added, removed); "output
// artifacts/x.md altered (...)" or "missing"; "evidence expired (...)";
// "attempt 1 was interrupted: session ... is gone"; "attempt 2 failed:
// ...; retrying"; an operator's reason for Invalidate; "approved by
// NAME". It reads no file. Safe for concurrent use, also after the
// attempt ended.
func (st *Stage) Reason() string { return st.reason }
