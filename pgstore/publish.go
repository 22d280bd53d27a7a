package pgstore

import (
	"sync"
	"time"

	"github.com/runstate/runstate"
)

// handoffEvery is how often, at most, a session writes the handoff text
// to the projections row.
const handoffEvery = time.Second

// published holds the projections a session was given and has not
// written yet (Batch.Publish), the newest of each. Safe for concurrent use.
type published struct {
	mu       sync.Mutex
	manifest *projection
	handoff  *projection
	wrote    time.Time // the handoff's last write
}

type projection struct {
	at   runstate.Position
	data []byte
}

func (p *published) keep(at runstate.Position, manifest, handoff []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if manifest != nil && (p.manifest == nil || p.manifest.at.Seq <= at.Seq) {
		p.manifest = &projection{at: at, data: manifest}
	}
	if handoff != nil && (p.handoff == nil || p.handoff.at.Seq <= at.Seq) {
		p.handoff = &projection{at: at, data: handoff}
	}
}

// take returns what is due: the manifest whenever there is one, the
// handoff once handoffEvery has passed since its last write (or with all).
func (p *published) take(now time.Time, all bool) (manifest, handoff *projection) {
	p.mu.Lock()
	defer p.mu.Unlock()
	manifest, p.manifest = p.manifest, nil
	if p.handoff != nil && (all || now.Sub(p.wrote) >= handoffEvery) {
		handoff, p.handoff, p.wrote = p.handoff, nil, now
	}
	return manifest, handoff
}
