//go:build race

package runstate

// raceEnabled loosens the timing bounds of the performance tests: the race
// detector makes Go code several times slower.
const raceEnabled = true
