module github.com/runstate/runstate

go 1.26.0

require (
	github.com/gofrs/flock v0.13.2
	github.com/google/uuid v1.6.0
)

require golang.org/x/sys v0.49.0 // indirect
