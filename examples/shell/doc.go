// Package shell holds a pipeline written in bash with the runstate command
// (pipeline.sh, notify.sh) and the test that kills it at several moments and
// checks that, run again, it ends as an uninterrupted run does. See
// README.md.
package shell
