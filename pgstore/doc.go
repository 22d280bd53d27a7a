// Package pgstore keeps runstate runs in PostgreSQL.
package pgstore
