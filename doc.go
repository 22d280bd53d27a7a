// Package runstate gives agent programs durable, restartable run state.
package runstate
