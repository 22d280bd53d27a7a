module github.com/runstate/runstate

go 1.26.0

require (
	github.com/gofrs/flock v0.13.2
	github.com/google/uuid v1.6.0
	github.com/stretchr/testify v1.12.1
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
