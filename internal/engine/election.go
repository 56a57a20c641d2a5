package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/watermill-pglease/internal/check"
	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// This file holds the decisions of the maintainer's election that need no
// database, as plain functions of what its statements returned: whether
// a Subscriber stands and how it would do the partition DDL
// (candidacyOf), whether the row looks free enough to run the claim
// (looksFree), how long a candidate waits before it looks again
// (candidateWait), and whether a term that ends releases the row
// (releaseAtTermEnd). The maintainer applies them; they are table-tested
// in election_internal_test.go.

// candidateKind is whether, and how, a Subscriber stands for maintainer.
type candidateKind int

const (
	// notStanding: the role may neither run the partition DDL nor call
	// the owner's functions for it.
	notStanding candidateKind = iota
	// standAsOwner: the role has the owner's privileges and runs the DDL.
	standAsOwner
	// standDelegated: the DDL goes through the owner's SECURITY DEFINER
	// functions, which the role may call (GrantSQL).
	standDelegated
)

// candidacy is what a Subscriber concludes from its role's access.
type candidacy struct {
	kind candidateKind
	// missing says what the role lacks when it does not stand.
	missing []string
}

// candidacyOf decides from the access statement's answer (row, err)
// whether the Subscriber stands. A permission error (42501, typically no
// USAGE on the schema) means it does not; any other error means it could
// not find out and is returned, to be retried.
func candidacyOf(row pgsql.AccessRow, err error) (candidacy, error) {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return candidacy{missing: []string{pgErr.Message}}, nil
	case errors.Is(err, pgx.ErrNoRows):
		return candidacy{}, fmt.Errorf("the messages table is missing (run pglease.Migrate)")
	case err != nil:
		return candidacy{}, check.MissingSchema(err)
	case row.Owns:
		return candidacy{kind: standAsOwner}, nil
	case len(row.Missing) == 0:
		return candidacy{kind: standDelegated}, nil
	}
	return candidacy{missing: row.Missing}, nil
}

// looksFree reports whether the maintainer's row, as read, may be claimed
// by session me: it has no holder, me holds it (a claim whose reply was
// lost, or a new term of the same session), or its holder's session row
// is gone or expired. Only then does the candidate run the claim, whose
// plan costs more than the read's.
func looksFree(row pgsql.HolderRow, me uuid.UUID) bool {
	return row.Holder == nil || *row.Holder == me || row.ExpiresInMs == nil || *row.ExpiresInMs <= 0
}

// candidateWait is how long a candidate that did not win waits before it
// reads the row again: 100 ms, or until just after the holder's session
// expires (expiresInMs, nil when unknown), whichever is later, plus
// spread, a random part of a tenth of the TTL that keeps the candidates
// from queuing on the expired session row's lock at once.
func candidateWait(expiresInMs *int64, spread time.Duration) time.Duration {
	wait := 100*time.Millisecond + spread
	if expiresInMs != nil {
		wait = max(wait, time.Duration(*expiresInMs)*time.Millisecond+20*time.Millisecond+spread)
	}
	return wait
}

// releaseAtTermEnd reports whether a maintainer whose term ends releases
// the row: when the Subscriber is closing, so that another candidate
// takes over at once, unless its session was lost (the row is no longer
// its own to release: a fenced release would change nothing, and the
// candidates take it when the session expires).
func releaseAtTermEnd(closing, sessionLost bool) bool {
	return closing && !sessionLost
}
