package runstate

import "time"

// EffectiveManifestInterval is how long r waits between two manifest
// rewrites now (manifestInterval: Options.ManifestInterval, or longer when
// a rewrite is slow), for the package's external tests.
func EffectiveManifestInterval(r *Run) time.Duration { return r.manifestInterval() }
