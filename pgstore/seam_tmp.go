package pgstore

// TEMPORARY: the shapes of DESIGN-pg.md §9 until the seam branch lands
// runstate.Store; then these become aliases and go away.

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/runstate/runstate"
)

type Position struct {
	Seq          int64
	Hash         string
	End, LastLen int64
	CRC          bool
}

type Store interface {
	Open(ctx context.Context, session string) (snapshot []byte, at Position, err error)
	Lock(ctx context.Context, from Position) (Batch, error)
	Read(ctx context.Context, from Position, fn func(line []byte) error) (tornAt int64, err error)
	Live(ctx context.Context, sessions []string) (map[string]bool, error)
	Blobs() Blobs
	Close(clean bool) error
	String() string
}

type Batch interface {
	Tail(fn func(line []byte) error) error
	Now() time.Time
	Alive(session string) bool
	Append(recs []*runstate.Record, lines []byte, to Position) error
	Sync(ctx context.Context) error
	Publish(at Position, manifest, handoff []byte)
	Unlock() error
	Abort() error
}

type Blobs interface {
	Missing(ctx context.Context, sha256s []string) ([]string, error)
	Put(ctx context.Context, sha256 string, size int64, r io.Reader) error
	Get(ctx context.Context, sha256 string) (io.ReadCloser, error)
}

var ErrSessionLost = errors.New("runstate: session lost")
